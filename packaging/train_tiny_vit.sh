#!/usr/bin/env bash
# Train the built-in "tiny-vit-digits" checkpoint (the Lessons tab's tiny ViT on scikit-learn's 8×8 digits)
# and record how: resources/models/tiny-vit-digits.json holds this command, the seed, the data, the epochs,
# the time and the held-out accuracy; tests/lessons/test_train_vit.py checks the file against that record.
set -euo pipefail
cd "$(dirname "$0")/.."
python main.py train-vit --data digits --epochs 40 --seed 0 \
    --out resources/models/tiny-vit-digits.safetensors --json resources/models/tiny-vit-digits.json
