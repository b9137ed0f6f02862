# Source on the GPU machine from the repo root: installs the carried wheels (.whl/, see
# bench/README.md) into /tmp/site once per machine and registers this checkout's kernel provisioner
# entry point, so a real jupyter-server and kernels run there without pip access. Later commands on the
# same machine need not carry .whl/ again.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
elif [ ! -d /tmp/site/jupyter_server ]; then
  echo "device_env.sh: carry .whl/ (the Jupyter wheels) on this machine's first command" >&2
  return 1
fi
d=/tmp/site/jupyter_gpushare-0.1.0.dist-info
mkdir -p "$d"
printf 'Metadata-Version: 2.1\nName: jupyter-gpushare\nVersion: 0.1.0\n' > "$d/METADATA"
printf '[jupyter_client.kernel_provisioners]\ngpushare-provisioner = jupyter_gpushare.launch.provisioner:GpuShareProvisioner\n' > "$d/entry_points.txt"
export PYTHONPATH="$PWD:/tmp/site"
# The server extension, enabled as the wheel's jupyter_server_config.d file enables it on install.
mkdir -p /tmp/site/etc/jupyter/jupyter_server_config.d
cp jupyter-config/server-config/jupyter_gpushare.json /tmp/site/etc/jupyter/jupyter_server_config.d/
export JUPYTER_CONFIG_PATH=/tmp/site/etc/jupyter
