# Sourced by the bench/device_batch_*.sh scripts: strict mode, unbuffered Python, and the card's name in $name
# (the kernel bench runs only where it is an H200).
set -u
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
