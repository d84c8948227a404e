# sourced: flashinfer from the offline bundle, packed JIT modules installed
export PYTHONUNBUFFERED=1
date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
mkdir -p /tmp/site && tar -C /tmp/site -xJf .fib/fi_strip.tar.xz \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fib/*.whl
export PYTHONPATH=/tmp/site:$PWD
for p in .fib/fi_aot*.tar.xz; do python3 .fib/flashinfer_aot.py install $p; done
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
python3 -c "import sys, torch, triton, flashinfer; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__)"
git log --oneline -1 2>/dev/null
