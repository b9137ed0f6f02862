"""Inside the kernel: what each GPU framework is capped with, around its import.

Standard library only, Python >= 3.9 (see ``_gpushare_boot``, which registers these hooks).
Each framework gets ``pre(module)``, run just before the module executes (set the environment
knobs it reads later), and ``post(module)``, run just after (configure it, say in the report
what was capped and how, register its out-of-memory error for the note). None of them creates a
CUDA context.
"""

from __future__ import annotations

import os

import _gpushare_env as env
import _gpushare_oom as oom
import _gpushare_report as rep

# Oldest torch whose PYTORCH_CUDA_ALLOC_CONF is known to accept per_process_memory_fraction (checked
# on torch 2.11, see DESIGN.md); older ones reject unknown keys, so they get the deferred call.
TORCH_ENV_CAP_SINCE = (2, 11)
MiB = 2**20


# -- PyTorch ---------------------------------------------------------------------------------------

_torch_plan: dict = {}


def merge_alloc_conf(existing: str, fraction: str) -> tuple[str, str | None]:
    """``existing`` allocator config with ``per_process_memory_fraction`` at most ``fraction``.

    Returns the new value and, when the user had asked for more, a message saying it was lowered.
    """
    parts = [p.strip() for p in existing.split(",") if p.strip()]
    out, note, found = [], None, False
    for part in parts:
        key, _, value = part.partition(":")
        if key.strip() != "per_process_memory_fraction":
            out.append(part)
            continue
        found = True
        try:
            keep = 0 < float(value) <= float(fraction)
        except ValueError:
            keep = False
        if keep:
            out.append(part)
        else:
            out.append(f"per_process_memory_fraction:{fraction}")
            note = f"per_process_memory_fraction:{value.strip()} in the allocator config was lowered to this kernel's quota ({fraction} of the card)"
    if not found:
        out.append(f"per_process_memory_fraction:{fraction}")
    return ",".join(out), note


def _torch_pre(module) -> None:
    _torch_plan.clear()
    version, cuda = rep.torch_build(module)
    _torch_plan.update(version=version, cuda=cuda)
    if rep.no_cap_reason() or cuda is None or version is None:
        return
    fraction = os.environ.get(env.TORCH_FRACTION) or f"{rep.fraction():.6f}"
    if rep.version_tuple(version) < TORCH_ENV_CAP_SINCE:
        _torch_plan["method"] = "lazy"
        return
    # PYTORCH_CUDA_ALLOC_CONF wins over PYTORCH_ALLOC_CONF; extend the one torch will read.
    name = (
        "PYTORCH_ALLOC_CONF"
        if "PYTORCH_ALLOC_CONF" in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
        else "PYTORCH_CUDA_ALLOC_CONF"
    )
    value, note = merge_alloc_conf(os.environ.get(name, ""), fraction)
    os.environ[name] = value
    if note:
        rep.warn(note)
    _torch_plan.update(method="env", variable=name, fraction=fraction)


def _torch_post(torch) -> None:
    version = getattr(torch, "__version__", None) or _torch_plan.get("version")
    version = str(version) if version else None
    oom.register_oom_type(getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None))
    reason = rep.no_cap_reason()
    if reason:
        return rep.set_framework("torch", False, f"not capped: {reason}", version=version)
    if getattr(torch.version, "cuda", None) is None:
        return rep.set_framework(
            "torch", False, "not capped: this PyTorch is a CPU-only build, it cannot use the GPU", version=version
        )
    quota = rep.cap_mib()
    method = _torch_plan.get("method", "lazy")
    if method == "env" and not torch.cuda.is_initialized():
        text = f"{_torch_plan['variable']} per_process_memory_fraction:{_torch_plan['fraction']} (of the card's total memory)"
        return rep.set_framework("torch", True, text, quota, version)

    def apply() -> None:
        real = torch.cuda.get_device_properties
        props = getattr(real, "__wrapped__", real)(0)  # the card's own size, not the quota the view shows
        fraction = min(1.0, quota * MiB / props.total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
        rep.set_framework(
            "torch",
            True,
            f"torch.cuda.set_per_process_memory_fraction({fraction:.4f}) at CUDA initialisation",
            quota,
            version,
        )

    if torch.cuda.is_initialized():  # only if something initialised CUDA before torch finished importing
        apply()
        return None
    lazy = getattr(torch.cuda, "_lazy_call", None)
    if lazy is None:
        return rep.set_framework(
            "torch", False, "not capped: this torch has no torch.cuda._lazy_call to defer the cap", version=version
        )
    lazy(apply)
    text = f"torch.cuda.set_per_process_memory_fraction, deferred to CUDA initialisation (torch {version} has no per_process_memory_fraction allocator setting)"
    return rep.set_framework("torch", True, text, quota, version)


# -- TensorFlow -------------------------------------------------------------------------------------

_tf_capped_devices: list = []


def _drop_async_allocator() -> None:
    if os.environ.get("TF_GPU_ALLOCATOR", "").strip() == "cuda_malloc_async":
        del os.environ["TF_GPU_ALLOCATOR"]
        rep.warn(
            "TF_GPU_ALLOCATOR=cuda_malloc_async was unset: that allocator ignores a logical device's memory_limit, "
            "so TensorFlow could take memory past this kernel's quota. TensorFlow uses its default (BFC) allocator."
        )


def _tf_pre(module) -> None:
    if not rep.no_cap_reason():
        _drop_async_allocator()


def clamp_logical_devices(configs: list, quota_mib: int) -> tuple[list, str | None]:
    """Scale GPU logical-device memory limits down so that together they fit in ``quota_mib``.

    ``configs`` are ``tf.config.LogicalDeviceConfiguration`` (named tuples). A limit left out gets
    an equal share of the quota. Returns the new list and a message when anything was changed.
    """
    n = len(configs)
    if n == 0:
        return configs, None
    asked = [c.memory_limit for c in configs]
    if any(a is None for a in asked):
        share = max(1, quota_mib // n)
        out = [c if c.memory_limit is not None else c._replace(memory_limit=share) for c in configs]
        fixed, note = clamp_logical_devices(out, quota_mib)
        return (
            fixed,
            note
            or f"logical GPU devices without memory_limit were given {share} MiB each (this kernel's quota is {quota_mib} MiB)",
        )
    total = sum(asked)
    if total <= quota_mib:
        return configs, None
    out = [c._replace(memory_limit=max(1, int(c.memory_limit * quota_mib // total))) for c in configs]
    new = [c.memory_limit for c in out]
    return out, (
        f"the logical GPU device configuration asked for {total} MiB ({', '.join(map(str, asked))}); "
        f"it was lowered to {sum(new)} MiB ({', '.join(map(str, new))}) to fit this kernel's quota of {quota_mib} MiB"
    )


def _tf_post(tf) -> None:
    version = str(getattr(tf, "__version__", "")) or None
    try:
        from tensorflow.python.framework import errors_impl

        oom.register_oom_type(errors_impl.ResourceExhaustedError)
    except Exception:
        pass
    config = tf.config
    gpus = config.list_physical_devices("GPU")  # enumerates devices; does not initialise the runtime
    reason = rep.no_cap_reason()
    if not gpus:
        why = reason or "no GPU is visible to TensorFlow"
        built = getattr(getattr(tf, "test", None), "is_built_with_cuda", None)
        if built is not None and not built():
            why += " (this TensorFlow is built without CUDA)"
        return rep.set_framework("tensorflow", False, f"not capped: {why}", version=version)
    if reason:
        return rep.set_framework("tensorflow", False, f"not capped: {reason}", version=version)
    _drop_async_allocator()
    quota = rep.cap_mib()
    make = config.LogicalDeviceConfiguration
    try:
        for gpu in gpus:
            config.set_logical_device_configuration(gpu, [make(memory_limit=quota)])
    except RuntimeError as e:
        rep.warn(
            f"the GPU memory cap could not be applied: TensorFlow was initialised before the hook ({e}); TensorFlow may take most of the card"
        )
        return rep.set_framework(
            "tensorflow", False, "cap not applied: TensorFlow was initialised before the hook", version=version
        )
    _tf_capped_devices[:] = list(gpus)
    _wrap_tf_config(config, quota)
    many = f" on each of {len(gpus)} visible GPUs" if len(gpus) > 1 else ""
    return rep.set_framework(
        "tensorflow",
        True,
        f"logical GPU device with memory_limit={quota} MiB{many}; memory grows within it (TF_FORCE_GPU_ALLOW_GROWTH)",
        quota,
        version,
    )


def _wrap_tf_config(config, quota: int) -> None:
    """Keep the cap when the notebook configures GPUs itself, as plain TensorFlow notebooks do."""
    experimental = config.experimental
    make = config.LogicalDeviceConfiguration

    def wrap_logical(original):
        if getattr(original, "_gpushare", False):
            return original

        def set_logical_device_configuration(device, logical_devices):
            if getattr(device, "device_type", None) == "GPU" and device in _tf_capped_devices:
                if logical_devices is None:
                    logical_devices = [make(memory_limit=quota)]
                    rep.warn(
                        f"the GPU's logical device configuration was kept at memory_limit={quota} MiB (this kernel's quota), not removed"
                    )
                else:
                    logical_devices, note = clamp_logical_devices(list(logical_devices), quota)
                    if note:
                        rep.warn(note)
                        rep.set_framework(
                            "tensorflow",
                            True,
                            f"notebook's logical GPU devices clamped to {quota} MiB in total",
                            quota,
                            rep.STATE["frameworks"].get("tensorflow", {}).get("version"),
                        )
            return original(device, logical_devices)

        set_logical_device_configuration._gpushare = True
        set_logical_device_configuration.__doc__ = original.__doc__
        return set_logical_device_configuration

    def wrap_growth(original):
        if getattr(original, "_gpushare", False):
            return original

        def set_memory_growth(device, enable):
            try:
                return original(device, enable)
            except ValueError as e:
                # Our logical device already grows within the quota (TF_FORCE_GPU_ALLOW_GROWTH=true);
                # TensorFlow refuses growth on a device with logical devices, so this is a no-op.
                if device in _tf_capped_devices and "virtual devices" in str(e):
                    return None
                raise

        set_memory_growth._gpushare = True
        set_memory_growth.__doc__ = original.__doc__
        return set_memory_growth

    for owner, name in (
        (config, "set_logical_device_configuration"),
        (experimental, "set_virtual_device_configuration"),
    ):
        if hasattr(owner, name):
            setattr(owner, name, wrap_logical(getattr(owner, name)))
    if hasattr(experimental, "set_memory_growth"):
        experimental.set_memory_growth = wrap_growth(experimental.set_memory_growth)


# -- JAX --------------------------------------------------------------------------------------------


def _jax_pre(module) -> None:
    if rep.no_cap_reason():
        return
    fraction = rep.cap_fraction()
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower() == "platform":
        del os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]
        rep.warn("XLA_PYTHON_CLIENT_ALLOCATOR=platform was unset: that allocator has no memory cap")
    # One variable only: recent jaxlib (0.10, 0.11) refuses to start its CUDA plugin (falling back to the CPU)
    # when XLA_CLIENT_MEM_FRACTION and the deprecated XLA_PYTHON_CLIENT_MEM_FRACTION are both set,
    # and older jaxlib reads only the deprecated one. Every jaxlib reads XLA_PYTHON_CLIENT_MEM_FRACTION
    # alone, so the smallest fraction asked for (ours at most) goes there.
    asked, keep = {}, fraction
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        value = os.environ.pop(name, None)
        if value is None:
            continue
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None and 0 < number <= fraction + 1e-9:
            keep = min(keep, number)
        elif not (name == "XLA_PYTHON_CLIENT_MEM_FRACTION" and value == f"{fraction:.6f}"):
            asked[name] = value
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{keep:.6f}"
    for name, value in asked.items():
        rep.warn(f"{name}={value} was lowered to {fraction:.6f}, this kernel's quota as a fraction of the card")


def _jax_gpu_plugin() -> bool:
    import importlib.util

    for name in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _jax_post(jax) -> None:
    version = str(getattr(jax, "__version__", "")) or None
    errors = getattr(jax, "errors", None)
    cls = getattr(errors, "JaxRuntimeError", None)
    if cls is None:
        try:
            from jaxlib.xla_extension import XlaRuntimeError

            cls = XlaRuntimeError
        except Exception:
            cls = None
    oom.register_oom_type(cls)
    reason = rep.no_cap_reason()
    if reason:
        return rep.set_framework("jax", False, f"not capped: {reason}", version=version)
    platforms = os.environ.get("JAX_PLATFORMS", os.environ.get("JAX_PLATFORM_NAME", ""))
    if platforms and "cuda" not in platforms and "gpu" not in platforms:
        return rep.set_framework(
            "jax", False, f"not capped: JAX_PLATFORMS={platforms}, JAX does not use the GPU", version=version
        )
    if not _jax_gpu_plugin():
        return rep.set_framework(
            "jax", False, "not capped: this JAX has no CUDA plugin (jax[cuda]), it runs on the CPU", version=version
        )
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").strip().lower() not in ("false", "0")
    grows = "taken at first use (XLA_PYTHON_CLIENT_PREALLOCATE)" if preallocate else "grows on demand up to it"
    text = f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} of the card's total memory; the pool {grows}"
    return rep.set_framework("jax", True, text, rep.quota_mib(), version)


# -- CuPy -------------------------------------------------------------------------------------------


def _cupy_limit_bytes(value: str) -> int | None:
    value = value.strip()
    try:
        if value.endswith("%"):
            total = rep.env_int(env.CARD_TOTAL_MIB)
            return int(float(value[:-1]) / 100 * total * MiB) if total else None
        return int(float(value))
    except ValueError:
        return None


def _cupy_pre(module) -> None:
    if rep.no_cap_reason():
        return
    cap = rep.cap_mib() * MiB
    value = os.environ.get("CUPY_GPU_MEMORY_LIMIT")
    asked = _cupy_limit_bytes(value) if value is not None else None
    if not asked or asked > cap:  # 0 means unlimited to CuPy
        os.environ["CUPY_GPU_MEMORY_LIMIT"] = str(cap)
        if value is not None:
            rep.warn(f"CUPY_GPU_MEMORY_LIMIT={value} was lowered to {cap} bytes, this kernel's quota")


def _cupy_post(cupy) -> None:
    version = str(getattr(cupy, "__version__", "")) or None
    try:
        from cupy.cuda.memory import OutOfMemoryError

        oom.register_oom_type(OutOfMemoryError)
    except Exception:
        pass
    reason = rep.no_cap_reason()
    if reason:
        return rep.set_framework("cupy", False, f"not capped: {reason}", version=version)
    limit = os.environ.get("CUPY_GPU_MEMORY_LIMIT")
    return rep.set_framework(
        "cupy", True, f"CUPY_GPU_MEMORY_LIMIT={limit} bytes (CuPy's default memory pool)", rep.quota_mib(), version
    )


HOOKS = {
    "torch": (_torch_pre, _torch_post),
    "tensorflow": (_tf_pre, _tf_post),
    "jax": (_jax_pre, _jax_post),
    "cupy": (_cupy_pre, _cupy_post),
}
