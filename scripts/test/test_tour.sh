#!/usr/bin/env bash
# Runs every command of README.md's guided tour, so that the tour never goes stale: the lines of the
# ```bash blocks between its heading and the next section, in order, in one shell (the first block sets
# the variable the others use), from the repository's root. A command passes when it exits 0. The runs
# write under out/tour, which is removed first and at the end. MPI is told to allow root and more ranks
# than cores through its environment, so the README's commands stay as a user types them.
#   usage: scripts/test/test_tour.sh   (after make: the CPU programs and build/test_pipeline)
set -u
cd "$(dirname "$0")/../.."
source scripts/test/test_lib.sh
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# the tour's commands, one per line (backslash continuations joined)
/usr/bin/python3 - README.md >"$work/commands" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
start = text.index("## A guided tour")
end = text.index("\n## ", start + 1)
for block in re.findall(r"```bash\n(.*?)```", text[start:end], re.S):
    for command in block.replace("\\\n", " ").splitlines():
        if command.strip():
            print(command.strip())
EOF
count=$(wc -l <"$work/commands")
if [[ $count -ge 10 ]]; then ok "the tour has $count commands"; else bad "the tour has only $count commands"; fi

rm -rf out/tour && mkdir -p out/tour
while IFS= read -r command; do
    start=$SECONDS
    if eval "$command" >"$work/last.out" 2>&1 </dev/null; then
        ok "$command ($((SECONDS - start)) s)"
    else
        bad "$command: $(grep -m1 -i error "$work/last.out" || tail -1 "$work/last.out")"
    fi
done <"$work/commands"
[[ -s out/tour/1f1b.png ]] && ok "the measured pipeline timeline was drawn (out/tour/1f1b.png)" ||
    bad "no out/tour/1f1b.png"
[[ -s out/tour/1f1b_memory.png ]] && ok "the memory over that step was drawn (out/tour/1f1b_memory.png)" ||
    bad "no out/tour/1f1b_memory.png"
ramp_batches=$(grep -o '"batch_tokens": [0-9]*' out/tour/ramp/log.jsonl 2>/dev/null | awk '{printf "%s ", $2}')
[[ $ramp_batches == "64 128 256 " ]] && ok "the batch ramp's steps trained 64, 128 and 256 tokens" ||
    bad "the batch ramp's steps trained: ${ramp_batches:-nothing logged}"
rm -rf out/tour
finish
