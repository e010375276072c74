"""What each removal in installers/learning-at-home.spec saves: an untrimmed bundle against the real one.

    LAH_BUNDLE_TRIM=0 .venv/bin/pyinstaller --noconfirm --distpath build/untrimmed \\
        --workpath build/pyinstaller-untrimmed installers/learning-at-home.spec
    .venv/bin/python benchmarks/bundle_trim.py build/untrimmed/learning-at-home dist/learning-at-home

Every file of the untrimmed bundle that is absent from the trimmed one, or smaller in it, is put under
the first rule below that matches it (the rules mirror the spec's comments); what no rule claims is
reported as "other", so the rows add up to the whole difference. The last line is JSON.
"""

from __future__ import annotations

import json
import os
import sys
from fnmatch import fnmatch
from pathlib import Path

MIB = 1 << 20

RULES: list[tuple[str, list[str]]] = [
    ("PyAV and FFmpeg, replaced by the stand-in (installers/stubs/av)", [
        "av/*", "av.libs/*", "*-????????.so*",  # auditwheel's hashed names: FFmpeg's own libraries
        "libmvec.so*",  # glibc's vector maths, linked by libx265 only
    ]),
    ("torch: C++ test binaries, headers, CMake files, test libraries", [
        "torch/test/*", "torch/bin/*", "torch/include/*", "torch/share/*", "torch/lib/*test*",
        "torch/lib/libbackend_with_compiler*", "torch/lib/libaoti_custom_ops*",
    ]),
    ("torch: ONNX exporter, TensorBoard (module excludes)", ["torch/onnx/*", "torch/utils/tensorboard/*"]),
    ("Qt: translations", ["PySide6/Qt/translations/*"]),
    ("Qt: unused plugins (TLS, network information, input, themes, VNC/minimal/Vulkan platforms)", [
        "PySide6/Qt/plugins/*",
    ]),
    ("Qt: unused modules (QML, Quick, PDF, SQL, Test, Designer, UiTools, Xml, Help, PrintSupport)", [
        "PySide6/Qt/lib/*", "PySide6/Qt/qml/*", "PySide6/Qt[A-Z]*.so",  # after the plugins: * spans "/"
    ]),
    ("the build machine's GTK stack (linked only by Qt's GTK theme plugin)", [
        f"{lib}*" for lib in (
            "libgtk-3", "libgdk-3", "libgdk_pixbuf", "libatk", "libatspi", "libcairo", "libpango", "libepoxy",
            "libharfbuzz", "libgraphite2", "libthai", "libdatrie", "libfribidi", "libpixman", "libgio-2",
            "libgmodule", "libgobject", "libmount", "libblkid", "libselinux", "libXcomposite", "libXcursor",
            "libXdamage", "libXi.", "libXinerama", "libXrandr", "libXrender", "libXext", "libXfixes",
            "libXau.", "libXdmcp", "libbsd", "libmd.", "libjpeg",
        )
    ]),
    ("scikit-learn's other datasets and images (only digits is loaded)", ["sklearn/datasets/*"]),
    ("development tools and stdlib GUI (keyrings.alt, tkinter, ...)", [
        "keyrings/*", "tkinter/*", "_tk_data/*", "_tcl_data/*", "tcl*/*", "tk*/*", "libtk*", "libtcl*",
        "python3*/lib-dynload/_tkinter*",
    ]),
]
STRIPPED = "symbol tables stripped (libtorch_cpu.so, libpython, uvloop, asyncpg, ...)"


def sizes(root: Path) -> dict[str, int]:
    out = {}
    internal = root / "_internal"
    for dirpath, _dirs, names in os.walk(internal):
        for name in names:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out[p.relative_to(internal).as_posix()] = p.stat().st_size
    return out


def attribute(untrimmed: dict[str, int], trimmed: dict[str, int]) -> dict[str, int]:
    saved: dict[str, int] = {}
    for rel, size in untrimmed.items():
        now = trimmed.get(rel)
        if now is not None:
            if now < size:
                saved[STRIPPED] = saved.get(STRIPPED, 0) + size - now
            continue
        rule = next((name for name, patterns in RULES if any(fnmatch(rel, p) for p in patterns)), "other")
        saved[rule] = saved.get(rule, 0) + size
    added = sum(size for rel, size in trimmed.items() if rel not in untrimmed)
    if added:
        saved["added by the trimmed build (the PyAV stand-in, ...)"] = -added
    return saved


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    untrimmed, trimmed = sizes(Path(argv[0])), sizes(Path(argv[1]))
    saved = attribute(untrimmed, trimmed)
    total_before, total_after = sum(untrimmed.values()), sum(trimmed.values())
    print(f"untrimmed {total_before / MIB:.1f} MiB -> trimmed {total_after / MIB:.1f} MiB")
    rows = sorted(saved.items(), key=lambda kv: -kv[1])
    for name, size in rows:
        print(f"  {size / MIB:8.1f} MiB  {name}")
    print(json.dumps({
        "untrimmed_mib": round(total_before / MIB, 1),
        "trimmed_mib": round(total_after / MIB, 1),
        "saved_mib": {name: round(size / MIB, 1) for name, size in rows},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
