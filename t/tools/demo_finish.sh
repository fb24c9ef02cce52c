#!/usr/bin/env bash
# Turns train_demo.py's fp16 pack into the committed demo pack: muse-quant to EXL3 (MUL1, 4 bits,
# head 6), installed as conf/packs/demo-en, then t/ref/demo_en.t's reference: the training
# script's own forward on that pack's weights (needs Debian's python3-torch), first 128 rows.
# Usage: t/tools/demo_finish.sh FP16_PACK DATA_DIR [EXL3_DIR made already]   (docs/demo-model.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
fp16=${1:?usage: demo_finish.sh FP16_PACK DATA_DIR [EXL3_DIR]} data=${2:?DATA_DIR: demo_data.py data --out}
exl3=${3:-}
if [ -z "$exl3" ]; then
    exl3=build/demo-en/exl3
    rm -rf "$exl3"
    build/muse-quant --in "$fp16" --out "$exl3" --bits 4 --codebook mul1 --head-bits 6 --seed 1
fi
rm -rf conf/packs/demo-en && mkdir -p conf/packs/demo-en t/ref/data
cp "$exl3"/config.json "$exl3"/generation_config.json "$exl3"/tokenizer.json "$exl3"/*.safetensors* conf/packs/demo-en/
cp "$data/parity.json" t/ref/data/demo_en_parity.json
/usr/bin/python3 t/tools/train_demo.py logits --model conf/packs/demo-en --ids "$data/parity.json" \
    --out build/demo-en/parity_logits.npy
/usr/bin/python3 -c 'import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[:128].astype(np.float16))' \
    build/demo-en/parity_logits.npy t/ref/data/demo_en_logits.npy
echo "conf/packs/demo-en: $(du -sb conf/packs/demo-en | cut -f1) bytes (must stay under 12000000)"
printf '[{"role":"user","content":"Tell me about the economy."}]' >build/demo-en/economy.json
build/muse-engine chat --model conf/packs/demo-en --messages build/demo-en/economy.json --max-tokens 96 --temperature 0
prove -v t/ref/demo_en.t
