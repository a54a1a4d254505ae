#!/usr/bin/env bash
# The house's rules that a reader relies on and a compiler does not check, so that they stay true:
#   - parsing flags pulls in no model and no kernel: llmc/io/options.h's whole include closure (g++ -M) has
#     nothing under llmc/model/ or llmc/kernels/;
#   - no two files in llmc/ share a name (an editor's "open file" and a reader's "see moe.cuh" find one);
#   - the pipeline is at most four llmc/parallel/pipeline*.h files (the Pipeline, its schedule, its
#     simulator, its timeline);
#   - no host function of the mixture of experts (model/moe.cuh, kernels/moe_routing.cuh's launchers,
#     parallel/expert_parallel.h) takes more than 6 parameters: what they share travels in MoEPass, MoeShape,
#     MoeRouting and ExpertCounts. (__global__ kernels take raw pointers and are called by the launchers only.)
#   usage: scripts/test/test_structure.sh
set -u
cd "$(dirname "$0")/../.."
source scripts/test/test_lib.sh

echo '#include "llmc/io/options.h"' >"$work/options_only.cpp"
if closure=$(g++ -std=c++17 -DLLMC_CPU -I. -M "$work/options_only.cpp" 2>"$work/closure.err"); then
    heavy=$(echo "$closure" | tr ' \\' '\n\n' | grep -E 'llmc/(model|kernels)/' | sort -u | tr '\n' ' ')
    count=$(echo "$closure" | tr ' \\' '\n\n' | grep -c 'llmc/')
    if [[ -z $heavy ]]; then ok "options.h's include closure ($count headers) has no model or kernel header"
    else bad "options.h includes, through its closure: $heavy"; fi
else
    bad "g++ -M on options.h failed: $(head -1 "$work/closure.err")"
fi

shared=$(find llmc -type f -printf '%f\n' | sort | uniq -d | tr '\n' ' ')
if [[ -z $shared ]]; then ok "no two files in llmc/ share a name"; else bad "files in llmc/ that share a name: $shared"; fi

pipeline_files=$(ls llmc/parallel/pipeline*.h | wc -l)
if [[ $pipeline_files -le 4 ]]; then ok "the pipeline is $pipeline_files files (at most 4)"
else bad "the pipeline is $pipeline_files files: $(ls llmc/parallel/pipeline*.h | tr '\n' ' ')"; fi

# each host function's parameters: the text between its name's '(' and the matching ')', split on the commas
# outside <...> and (...)
/usr/bin/python3 - llmc/model/moe.cuh llmc/kernels/moe_routing.cuh llmc/parallel/expert_parallel.h \
    >"$work/moe_parameters" <<'EOF'
import re, sys
over, seen = [], 0
for path in sys.argv[1:]:
    text = re.sub(r"//[^\n]*", "", open(path).read())
    for match in re.finditer(r"^(?:template <[^>]*>\s*)?(?:inline |static )?([A-Za-z_][\w:<>,*& ]*?)\b(\w+)\(", text, re.M):
        if match.group(1).strip() in ("", "return", "struct") or "__global__" in match.group(0):
            continue
        depth, i, start = 1, match.end(), match.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        rest = text[i:i + 40].lstrip()
        if not rest.startswith("{") and not rest.startswith("->") and not rest.startswith("const {"):
            continue  # a declaration or a call, not a definition
        params, depth, current = [], 0, ""
        for ch in text[start:i - 1]:
            if ch in "<(": depth += 1
            if ch in ">)": depth -= 1
            if ch == "," and depth == 0: params.append(current); current = ""
            else: current += ch
        if current.strip(): params.append(current)
        seen += 1
        if len(params) > 6:
            over.append(f"{path}:{match.group(2)} ({len(params)})")
print(f"RESULT {seen} {' '.join(over) if over else '-'}")
EOF
read -r _ functions offenders <"$work/moe_parameters"
if [[ ${functions:-0} -ge 20 && $offenders == "-" ]]; then
    ok "no MoE host function over 6 parameters ($functions functions read)"
else
    bad "MoE host functions over 6 parameters (of ${functions:-0} read): $offenders"
fi
finish
