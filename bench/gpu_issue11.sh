#!/usr/bin/env bash
# The GPU speed checks that are still open (docs/performance.md, "What still needs a GPU") as ONE prepared run, most
# important first, each step capped so that the whole run ends inside BUDGET seconds and its results come back.
#
#   bash bench/gpu_issue11.sh COMFYUI OUT [BUDGET]      COMFYUI: a ComfyUI checkout; OUT: folder for the results;
#                                                       BUDGET: seconds for the whole run (default 540)
#   CPU smoke:  QUICK=1 python=/path/to/comfy-venv/bin/python bash bench/gpu_issue11.sh /path/to/ComfyUI out/gpu 900
#   device:     bash bench/gpu_issue11.sh .comfy out 540     (from the repository root, ComfyUI staged as below)
#
# Staging for a device that cannot reach the network (/.comfy/ and /.whl/ are git-ignored, never committed):
#   cd ComfyUI && git ls-files | grep -v -E '^(tests|tests-unit|api_server|alembic_db|script_examples|\.github|\.ci)/' \
#     | while read f; do [[ $f == *.py ]] || (( $(stat -c %s "$f") < 200000 )) && echo "$f"; done >files.txt \
#     && tar cf - -T files.txt | (mkdir -p REPO/.comfy && cd REPO/.comfy && tar xf -)    # ~6 MB: code, no tokenizers
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl torchsde==0.2.6 trampoline==0.1.2 av==18.1.0
#   (for an image without ComfyUI's torchsde and av; av pinned inside requirements-test.txt's av>=18.0,<19)
#   then on the device: "python3 -m pip install -q --no-index --no-deps --no-compile --target site .whl/*.whl &&
#   PYTHONPATH=$PWD/site bash bench/gpu_issue11.sh .comfy out 540", with carry [".comfy", ".whl"] when the device
#   copies only tracked files (the script ends its steps inside the budget, then packs the results)
#
# QUICK=1: the same steps on the CPU with the benches' tiny models and sizes (the numbers mean nothing; it checks every
# command line and the packaging; about 3 minutes on 2 cores). Writes $OUT/log.txt (every step's table, its command
# and exit code, then bench/gpu_verdict.py's verdict per target and Markdown tables) and $OUT/results.tgz (the JSON
# of every step).
#
# Steps (targets in brackets):
#  0 syncs        device syncs of the attention patches per model call, every strategy, with and without a face
#                 plan (PyTorch's sync debug mode; the sigma-read control row must show 1)   [0 per model call]
#  0b sampling_syncs  the same count over whole ComfyUI sampling runs (euler, 20 steps, SD1.5 512), unpatched vs
#                 every schedule incl. the step cache, with and without a face plan   [+0 per step vs unpatched]
#  1 sd15_512     SD1.5 512 batch 1 / 8, `balanced` vs unpatched + control row   [>= 0.98x; was 0.95-0.97x]
#                 and lowvram_8gb (the 4-8 GB preset, eager); --walk-steps: each call a new step, as in a run
#  2 sd15_1024    SD1.5 1024 batch 1 / 2 with the match-cost column              [match cost <= 10 % of the saving]
#  3 plan         SD1.5 512 / 1024 batch 2 with the eyes/mouth face-crop plan     [the plan's levels kept or dropped]
#  4 cache512     step cache on the 512 face crop, 20 steps                       [ours-both >= 1.5x; was 1.40x]
#  5 sdxl_1024    SDXL 1024 batch 1 / 2 / 8, `balanced` + control row            [>= 0.98x]
#  6 compiled     SD1.5 512 batch 1, TorchCompileModel inductor, `balanced` vs compiled unpatched (each variant
#                 compiled alone after a dynamo reset: minutes on the full model; --no-tome: no TomePatchModel
#                 variant, whose compile no target needs)
#  7 compiled_cache  the step cache compiled on the 512 crop
set -u
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if (($# < 2)); then
  echo "usage: bash bench/gpu_issue11.sh COMFYUI OUT [BUDGET_SECONDS]" >&2
  exit 2
fi
COMFYUI=$1 OUT=$2 budget=${3:-540}
start=$SECONDS
py=${python:-python3}
mkdir -p "$OUT/r"
log="$OUT/log.txt"
if [ -n "${QUICK:-}" ]; then
  dev="--device cpu --threads 2 --quick"
  s512=128 s1024=160 b8=2 reps=2 guide=128 steps=3 rounds=1 frame=256 cdev="--device cpu --threads 2" width=32
else
  dev="--device cuda --dtype fp16"
  s512=512 s1024=1024 b8=8 reps=15 guide=512 steps=20 rounds=3 frame=768 cdev="--device cuda --dtype fp16" width=320
fi

step() {  # step NAME CAP_SECONDS COMMAND...: run it with at most CAP seconds, less when the budget runs out
  local name=$1 cap=$2
  shift 2
  local left=$((budget - (SECONDS - start) - 15))
  if ((left < 20)); then
    echo "=== $name: skipped, budget spent" >>"$log"
    return
  fi
  ((cap > left)) && cap=$left
  echo "=== $name (cap ${cap} s, at $((SECONDS - start)) s): $*" >>"$log"
  timeout -k 5 "$cap" "$@" >>"$log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - start)) s" >>"$log"
}

{
  date -u
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} >>"$log" 2>&1

U=("$py" bench/unet_step.py --comfyui "$COMFYUI" $dev)
C=("$py" bench/step_cache.py --comfyui "$COMFYUI" --part speed $cdev --model sd15 --guide "$guide" --steps "$steps"
  --frame "$frame" --rounds "$rounds")
step syncs 60 "$py" bench/patch_syncs.py --steps 20 --json "$OUT/r/syncs.json"
step sampling_syncs 90 "$py" bench/sampling_syncs.py --comfyui "$COMFYUI" --width "$width" --size "$s512" \
  --steps "$steps" --json "$OUT/r/sampling_syncs.json"
step sd15_512 100 "${U[@]}" --models sd15 --sizes "$s512" --batch "1,$b8" --presets balanced,lowvram_8gb --control \
  --walk-steps --repeats "$reps" --json "$OUT/r/sd15_512.json"
step sd15_1024 90 "${U[@]}" --models sd15 --sizes "$s1024" --batch 1,2 --presets balanced,balanced-static --control \
  --repeats 9 --json "$OUT/r/sd15_1024.json"
step plan 80 "${U[@]}" --models sd15 --sizes "$s512,$s1024" --batch 2 --plan --presets balanced,balanced-static \
  --repeats 9 --json "$OUT/r/plan.json"
step cache512 100 "${C[@]}" --variants ours-tokens,ours-cache,ours-both --json "$OUT/r/cache512.json"
step sdxl_1024 90 "${U[@]}" --models sdxl --sizes "$s1024" --batch "1,2,$b8" --presets balanced --control \
  --repeats 7 --json "$OUT/r/sdxl_1024.json"
step compiled 200 "${U[@]}" --models sd15 --sizes "$s512" --batch 1 --presets balanced --compile inductor \
  --no-tome --warmup 3 --repeats 5 --no-overhead --json "$OUT/r/compiled.json"
step compiled_cache 150 "${C[@]}" --variants ours-both --compile inductor --json "$OUT/r/compiled_cache.json"

echo "=== verdict (bench/gpu_verdict.py: each issue 11 target met, missed or not measured; tables for speed.md)" >>"$log"
"$py" bench/gpu_verdict.py "$OUT/r" --markdown >>"$log" 2>&1
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$OUT/r"
echo "=== done after $((SECONDS - start)) s" >>"$log"
