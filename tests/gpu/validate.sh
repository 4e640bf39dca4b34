#!/usr/bin/env bash
# The GPU validation of docs/gpu-validation.md, in one go, on a box with an NVIDIA GPU,
# its driver, nvidia-smi, PyTorch with CUDA, nvidia-ml-py, psutil and pytest; pydantic
# and PyYAML for `gpuwatch run` and the doctor (TensorFlow and Textual not needed).
#
#   bash tests/gpu/validate.sh [OUTPUT_DIR]
#
# Writes each step's output to OUTPUT_DIR (default: a new temporary folder) and prints
# it too; exits non-zero when the GPU tests fail. Record the results in
# docs/gpu-validation.md.
set -u -o pipefail
out=${1:-$(mktemp -d)}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # the script changes directory next
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}

{
    date -u
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total,memory.used --format=csv
    nvidia-smi nvlink -s 2>&1 | head -20
    "$py" -c 'import sys, pynvml, psutil; print(sys.version); print("nvidia-ml-py", pynvml.__file__); print("psutil", psutil.__version__)'
    "$py" - <<'PY'
# The raw fields gpuwatch reads, as this driver answers them.
import pynvml
pynvml.nvmlInit()
print("driver", pynvml.nvmlSystemGetDriverVersion(), "cuda", pynvml.nvmlSystemGetCudaDriverVersion_v2())
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print("name", pynvml.nvmlDeviceGetName(h))
for fid in (197, 198, pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT):
    fv = pynvml.nvmlDeviceGetFieldValues(h, [fid])[0]
    print("field", fid, "return", fv.nvmlReturn, "valueType", fv.valueType, "u64", fv.value.ullVal)
for link in range(18):
    try:
        print("nvlink", link, "state", pynvml.nvmlDeviceGetNvLinkState(h, link),
              "version", pynvml.nvmlDeviceGetNvLinkVersion(h, link))
    except pynvml.NVMLError as exc:
        print("nvlink", link, exc)
        break
pynvml.nvmlShutdown()
PY
} 2>&1 | tee "$out/device.txt"

"$py" -m pytest -p no:cacheprovider -o addopts= tests/gpu -m gpu -v -rs -s 2>&1 | tee "$out/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}

{
    "$py" bench/bench_sampler.py --seconds 20
    echo
    "$py" bench/bench_sampler.py --seconds 20 --pcie-window
} 2>&1 | tee "$out/bench-sampler.txt"

"$py" -m gpuwatch doctor 2>&1 | tee "$out/doctor.txt"

echo "GPU tests exit status: $tests_rc (outputs in $out)"
exit "$tests_rc"
