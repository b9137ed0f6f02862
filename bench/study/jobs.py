"""The job each kernel runs: MNIST-shaped training (5 epochs, batch 32) then inference over 60,000 images.

TensorFlow's job is the study's own: a Keras CNN (two convolutions through cuDNN, pooling, two dense
layers), trained with ``model.fit`` and run with ``model.predict``; in the ``growth`` and ``gpushare``
scenarios it first runs the cell TensorFlow notebooks start with, ``set_memory_growth`` on every GPU.

Data is generated (nothing is downloaded). A resident working set scales each job so that about
22 fit on the card, mirroring the study's 1,205 MiB jobs on a 24 GiB card at a larger card's scale.
The code prints ``PID <pid>`` first (so the harness can attribute NVML figures, and times a first cell's answer),
``GPU <s>`` once its first GPU operation is done (PyTorch, and NumPy on the simulated card), then ``DONE <s>``.
"""

from __future__ import annotations

TORCH = """
import os, time
print("PID", os.getpid(), flush=True)
t0 = time.time()
import torch
dev = "cuda"
x = torch.randn(60000, 1, 28, 28, device=dev)
torch.cuda.synchronize(); print("GPU", round(time.time() - t0, 3), flush=True)  # its first GPU operation done
y = torch.randint(0, 10, (60000,), device=dev)
working_set = torch.ones({ws_mib} * 2**20 // 4, device=dev)  # scales the job to ~1/22 of the card
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range({epochs}):
    for i in range(0, {n}, 32):
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad(); loss.backward(); opt.step()
with torch.no_grad():
    correct = sum(int((model(x[i:i + 32]).argmax(1) == y[i:i + 32]).sum()) for i in range(0, {n}, 32))
torch.cuda.synchronize()
print("DONE", round(time.time() - t0, 3), flush=True)
"""

JAX = """
import os, time
print("PID", os.getpid(), flush=True)
t0 = time.time()
import jax, jax.numpy as jnp
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (60000, 784))
y = jax.random.randint(key, (60000,), 0, 10)
working_set = jnp.ones(({ws_mib} * 2**20 // 4,), jnp.float32).block_until_ready()  # scales the job to ~1/22 of the card
params = [jax.random.normal(key, (784, 512)) * 0.01, jnp.zeros(512), jax.random.normal(key, (512, 10)) * 0.01, jnp.zeros(10)]
def predict(p, xb):
    return jnp.maximum(xb @ p[0] + p[1], 0) @ p[2] + p[3]
def loss(p, xb, yb):
    return -jnp.mean(jax.nn.log_softmax(predict(p, xb))[jnp.arange(xb.shape[0]), yb])
@jax.jit
def step(p, xb, yb):
    return [w - 0.01 * g for w, g in zip(p, jax.grad(loss)(p, xb, yb))]
predict_jit = jax.jit(predict)
for epoch in range({epochs}):
    for i in range(0, {n}, 32):
        params = step(params, x[i:i + 32], y[i:i + 32])
correct = sum(int((predict_jit(params, x[i:i + 32]).argmax(1) == y[i:i + 32]).sum()) for i in range(0, {n}, 32))
print("DONE", round(time.time() - t0, 3), flush=True)
"""

TENSORFLOW = """
import os, time
print("PID", os.getpid(), flush=True)
t0 = time.time()
import numpy as np, tensorflow as tf, keras
{growth}
rng = np.random.default_rng(0)
x = rng.random(({n}, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, {n})
working_set = tf.ones(({ws_mib} * 2**18,), tf.float32)  # scales the job to ~1/22 of the card
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.MaxPooling2D(), keras.layers.Flatten(),
    keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10),
])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs={epochs}, verbose=0)
correct = int((model.predict(x, batch_size=32, verbose=0).argmax(1) == y).sum())
print("DONE", round(time.time() - t0, 3), flush=True)
"""

GROWTH_CELL = "for g in tf.config.list_physical_devices('GPU'): tf.config.experimental.set_memory_growth(g, True)"

# CPU stand-in for the smoke test of the harness (simulated card, no GPU): same shape, NumPy; it says it holds
# its working set on the simulated card for a second, so the server measures a peak (the learned scenario).
NUMPY = """
import os, time
print("PID", os.getpid(), flush=True)
t0 = time.time()
import numpy as np
if os.environ.get("GPUSHARE_SIMULATED") == "1":
    import gpushare_simulate
    gpushare_simulate.use({ws_mib}); print("GPU", round(time.time() - t0, 3), flush=True); time.sleep(1.5)
rng = np.random.default_rng(0)
x = rng.standard_normal(({n}, 784), dtype=np.float32)
w = rng.standard_normal((784, 10), dtype=np.float32) * 0.01
for epoch in range({epochs}):
    for i in range(0, {n}, 32):
        w -= 0.001 * x[i:i + 32].T @ (x[i:i + 32] @ w)
print("DONE", round(time.time() - t0, 3), flush=True)
"""

CODE = {"torch": TORCH, "jax": JAX, "tensorflow": TENSORFLOW, "numpy": NUMPY}


# The idle study's job keeps its data and model between its two runs, as a notebook does, and frees its scratch
# working set (PyTorch's cache included) at the end: what an idle kernel then holds is its real state.
FREE_SCRATCH = {"torch": "del working_set; torch.cuda.empty_cache()", "numpy": "", "jax": "del working_set",
                "tensorflow": "del working_set"}  # fmt: skip


def job_code(
    framework: str, ws_mib: int, epochs: int = 5, n: int = 60000, growth: bool = True, free_scratch: bool = False
) -> str:
    """The job's code; ``growth``: TensorFlow's job starts with the memory-growth cell (not in ``defaults``);
    ``free_scratch``: it ends by freeing its scratch working set (the idle study)."""
    code = CODE[framework].format(ws_mib=ws_mib, epochs=epochs, n=n, growth=GROWTH_CELL if growth else "")
    return code + FREE_SCRATCH[framework] + "\n" if free_scratch else code
