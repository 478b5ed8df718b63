#!/usr/bin/env bash
# The README's CLI examples as a new user runs them on a fresh clone (after make main), placeholders filled with
# small real files (benchmarks/readme_walkthrough_inputs.py); one line per command in times.tsv: label, exit code,
# seconds, command. Usage: WALK=/tmp/walk/in bash benchmarks/readme_walkthrough.sh
cd "${REPO:-$(git rev-parse --show-toplevel)}"
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1
W=${WALK:-/tmp/walk/in}
D=../shared/data
T=${WALK:-/tmp/walk/in}/../times.tsv
mkdir -p "$(dirname "$T")"
: > $T
step() {  # step LABEL command...
  local label=$1; shift
  local start=$(date +%s.%N)
  "$@" > "${WALK:-/tmp/walk/in}/../log/$label.out" 2> "${WALK:-/tmp/walk/in}/../log/$label.err"
  local rc=$?
  local end=$(date +%s.%N)
  printf "%s\t%s\t%.1f\t%s\n" "$label" "$rc" "$(echo "$end - $start" | bc)" "$*" >> $T
  echo "$label rc=$rc"
}
mkdir -p ${WALK:-/tmp/walk/in}/../log
WALK=$W SHARED=../shared python benchmarks/readme_walkthrough_inputs.py
step train-sts embforge train --model all-MiniLM-L6-v2 --train $W/sts-train.csv --eval $W/sts-dev.csv --loss cosent --output runs/walk-sts --epochs 1 --batch-size 32 --lr 5e-5
step eval-sts embforge eval sts --model runs/walk-sts --data $D/stsb_en/stsb-en-test.csv
step encode embforge encode --model all-MiniLM-L6-v2 --input $W/sentences.txt --output runs/walk-sentences.npy
step encode-bf16 embforge encode --model all-MiniLM-L6-v2 --input $W/sentences.txt --output runs/walk-sentences-bf16.npy --amp bf16
step report embforge report runs/stsb-cosent
step eval-retrieval embforge eval retrieval --model all-MiniLM-L6-v2 --data $D/scifact --split dev --corpus-cache runs/scifact-emb
step eval-retrieval-hnsw embforge eval retrieval --model all-MiniLM-L6-v2 --data $D/scifact --split dev --index-kind hnsw --corpus-cache runs/scifact-emb
step mine-dense embforge mine --data $D/scifact --split train --output runs/walk-mined.jsonl --method dense --num-negatives 3 --relative-margin 0.05 --corpus-cache runs/scifact-emb
step mine-hybrid embforge mine --data $D/scifact --split train --output runs/walk-mined-hybrid.jsonl --method hybrid --num-negatives 3 --relative-margin 0.05 --absolute-margin 0.02 --skip-top 1 --hard-ratio 0.7 --corpus-cache runs/scifact-emb
step mine-pairs embforge mine --pairs $W/pairs.csv --corpus $W/docs.csv --output runs/walk-mined-pairs.jsonl
step mine-cache embforge mine --data $D/scifact --output runs/walk-mined2.jsonl --relative-margin 0.1 --corpus-cache runs/scifact-emb
step train-ce embforge train --model-type cross --model all-MiniLM-L6-v2 --train $W/pairs.tsv --loss cosent --output runs/ce
step mine-ce embforge mine --data $W/beir --output runs/walk-mined-ce.jsonl --method bm25 --relative-margin 0.1 --cross-encoder runs/ce --rescore-depth 30
step index-build embforge index build --data $W/beir --index runs/walk-idx --index-kind exact --corpus-cache runs/walk-emb
step index-build-hnsw embforge index build --data $W/beir --index runs/walk-idx-hnsw --index-kind hnsw --option m=32 --corpus-cache runs/walk-emb
step index-search embforge index search --index runs/walk-idx --query "vitamin D deficiency and bone fractures" -k 10
step train-retrieval embforge train --retrieval-train $W/beir --retrieval-eval-split dev --num-negatives 1 --mine-method dense --refresh-negatives-every 2 --hard-ratio-start 0.3 --hard-ratio-end 0.9 --output runs/r
step eval-pairs embforge eval pairs --model runs/ce --data $W/test.tsv --dev $W/dev.tsv
step eval-rerank embforge eval rerank --model runs/ce --data $W/test.tsv
step rerank embforge rerank --bi-model all-MiniLM-L6-v2 --cross-model runs/ce --data $W/test.tsv --top-k 20
step bench-quick python benchmarks/cosent_vs_ce.py --quick
step pipeline embforge train $W/pipeline.toml --output runs/walk-pipeline
step three-stage embforge train embforge/configs/three_stage.toml --output runs/three-stage
step eval-classification embforge eval classification --model all-MiniLM-L6-v2 --train $W/train.jsonl --test $W/test.jsonl
step eval-clustering embforge eval clustering --model all-MiniLM-L6-v2 --data $W/test.jsonl
DATA_ABS=$(cd $D && pwd)
( cd $W && step eval-matryoshka embforge eval matryoshka --model all-MiniLM-L6-v2 --task sts --data $DATA_ABS/stsb_en/stsb-en-test.csv --columns 0=sentence1,1=sentence2,2=score --dims 64,128,256 )
step torchrun-train torchrun --nproc-per-node 2 -m embforge train --train $W/pairs.csv --loss infonce --batch-size 64 --output runs/ddp --max-steps 3
step torchrun-encode torchrun --nproc-per-node 2 -m embforge encode --model all-MiniLM-L6-v2 --input $W/corpus.txt --output runs/corpus.npy
step torchrun-index torchrun --nproc-per-node 2 -m embforge index build --model all-MiniLM-L6-v2 --data $W/beir --index runs/index
step torchrun-mine torchrun --nproc-per-node 2 -m embforge mine --model all-MiniLM-L6-v2 --data $W/beir --output runs/walk-ddp-mined.jsonl
step torchrun-eval torchrun --nproc-per-node 2 -m embforge eval retrieval --model all-MiniLM-L6-v2 --data $W/beir --split dev
step export embforge export onnx --model all-MiniLM-L6-v2 --output exported/minilm --quantize int8
step export-dim embforge export onnx --model all-MiniLM-L6-v2 --output exported/minilm256 --quantize int8 --dim 256
echo done
# LLM embedders: no Qwen3-Embedding weights offline -> the same commands on a tiny random Qwen3 folder saved the same way
python -c "
import sys; sys.path.insert(0, '.')
from tests.decoder_models import make_decoder_encoder
make_decoder_encoder('qwen3').save('models/qwen3-embedding-tiny')"
printf 'a cat plays the piano\nthe dog\n' > $W/queries.txt
printf '{"anchor": "a cat plays the piano", "positive": "the cat plays a piano"}\n{"anchor": "a man drives a car", "positive": "the man drives the red car"}\n{"anchor": "a woman plays guitar", "positive": "the woman plays the guitar"}\n' > $W/qpairs.jsonl
step qwen-encode embforge encode --model models/qwen3-embedding-tiny --prompt-name query --input $W/queries.txt --output runs/q.npy
step qwen-lora embforge train --model models/qwen3-embedding-tiny --train $W/qpairs.jsonl --loss infonce --lora-r 16 --lr 1e-4 --merge-lora --output runs/qwen3-lora
echo done2
