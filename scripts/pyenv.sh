#!/usr/bin/env bash
# Creates (once) and prints the path of the project's Python virtual environment.
#
# The venv lives in the cache, outside the checkout, so a fresh clone (what CI
# runs) reuses it. It is rebuilt only when pyproject.toml's dependency lists
# change. The project's two distributions are not installed into it (only the `gpuhealth` launcher,
# below); the Makefile runs everything with PYTHONPATH at the checkout, so the code under test is
# always the code in the working tree.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUHEALTH_CACHE:-$HOME/.cache/gpu-health}
venv=${GPUHEALTH_VENV:-$cache/venv}
python=${PYTHON:-python3}
# The dependency lists come from the two pyproject.toml files (the pipeline's and the library's,
# gpuhealth/), the one place they are written; each stamp is a list's hash, so editing tool settings
# there does not rebuild. `pyenv.sh` installs what running needs (make up); `pyenv.sh --dev` adds the
# development tools (make test, make lint): pytest, hypothesis, mypy, ruff, selenium, transformers, ...
# A first stamp is the two files' own hash: when neither changed, nothing (not even Python) runs.
dev=false; [[ ${1:-} == --dev ]] && dev=true
inputs=$(cat "$here/pyproject.toml" "$here/gpuhealth/pyproject.toml" | sha256sum | cut -c1-16)

# The CLI as `gpuhealth` on the venv's PATH: a small launcher that runs this
# checkout's code (like the Makefile), rewritten only when it would change.
install_cli() {
  local want
  want=$(printf '#!/usr/bin/env bash\n# gpuhealth: the gpu-health CLI of %s (written by scripts/pyenv.sh)\nexport PYTHONPATH=%q${PYTHONPATH:+:$PYTHONPATH}\nexec %q -m services.api.cli "$@"\n' \
    "$here" "$here" "$venv/bin/python")
  if [[ ! -f $venv/bin/gpuhealth || $(cat "$venv/bin/gpuhealth") != "$want" ]]; then
    printf '%s\n' "$want" > "$venv/bin/gpuhealth.tmp" && chmod 0755 "$venv/bin/gpuhealth.tmp"
    mv "$venv/bin/gpuhealth.tmp" "$venv/bin/gpuhealth"
  fi
}

stamped() { [[ -f $venv/$1 && $(cat "$venv/$1") == "$2" ]]; }
current() {  # the venv has what is asked for, and the files are as they were when it was made
  [[ -x $venv/bin/python ]] && stamped .inputs "$inputs" && { ! $dev || stamped .inputs-dev "$inputs"; }
}
if current; then
  install_cli
  echo "$venv"
  exit 0
fi
requirements=$("$python" "$here/scripts/requirements.py")
stamp_want=$(echo "$requirements" | sha256sum | cut -c1-16)
dev_requirements=$("$python" "$here/scripts/requirements.py" --dev)
dev_stamp_want=$(echo "$dev_requirements" | sha256sum | cut -c1-16)
if [[ -x $venv/bin/python ]] && stamped .stamp "$stamp_want" && { ! $dev || stamped .stamp-dev "$dev_stamp_want"; }; then
  echo "$inputs" > "$venv/.inputs"  # the files changed, their dependency lists did not
  if stamped .stamp-dev "$dev_stamp_want"; then echo "$inputs" > "$venv/.inputs-dev"; fi
  install_cli
  echo "$venv"
  exit 0
fi

mkdir -p "$cache"
if $dev; then wanted=$dev_requirements; else wanted=$requirements; fi
echo "pyenv: installing Python dependencies$($dev && echo ' and the development tools') into $venv" >&2
[[ -x $venv/bin/python ]] || "$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --upgrade pip >&2
echo "$wanted" > "$venv/requirements.txt"
"$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" >&2
echo "$stamp_want" > "$venv/.stamp"
echo "$inputs" > "$venv/.inputs"
if $dev; then
  echo "$dev_stamp_want" > "$venv/.stamp-dev"
  echo "$inputs" > "$venv/.inputs-dev"
else
  rm -f "$venv/.stamp-dev" "$venv/.inputs-dev"
fi
install_cli
echo "$venv"
