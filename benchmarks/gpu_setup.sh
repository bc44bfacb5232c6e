#!/usr/bin/env bash
# Install the baseline wheels (FLA's fla_core and the official lightning_attn; pure Python, no dependencies pulled)
# for a side-by-side benchmark run on the GPU machine, which has torch, triton and einops but no network.
#
# Usage: bash benchmarks/gpu_setup.sh [REPO_ROOT]       (REPO_ROOT defaults to the current directory)
#        eval "$(bash benchmarks/gpu_setup.sh . | tail -n 1)"   # installs, then exports PYTHONPATH in this shell
#
# The wheels are expected in REPO_ROOT/.whl/ (git-ignored; copied there from shared/wheels/ and carried to the GPU
# machine). They go to /tmp/site, outside the repository. The last line printed is the export to run.
set -euo pipefail

root="${1:-.}"
site=/tmp/site
shopt -s nullglob
wheels=("$root"/.whl/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    echo "no wheels in $root/.whl/: baselines will be skipped (copy fla_core-*.whl and lightning_attn-*.whl there)" >&2
    echo "export PYTHONPATH=\"\${PYTHONPATH:-}\""
    exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[@]}" >&2
for w in "${wheels[@]}"; do echo "installed $(basename "$w") into $site" >&2; done
echo "export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"
