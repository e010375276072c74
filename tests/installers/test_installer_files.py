"""What can be checked here of the installers that are built elsewhere: syntax and the promises in them.

The Inno Setup script (Windows), the Info.plist, entitlements and dmgbuild settings (macOS), the
desktop entry and control file (Debian) and the PyInstaller spec are parsed and their key settings
asserted: per-user install, the data question on uninstall, a menu-bar-only app, no autostart entry.
"""

from __future__ import annotations

import configparser
import plistlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLERS = ROOT / "installers"


def iss_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(";") or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            current = m.group(1)
            assert current not in sections, f"section [{current}] twice"
            sections[current] = []
        else:
            assert current, f"a line outside any section: {line!r}"
            sections[current].append(line)
    return sections


def test_inno_setup_script() -> None:
    text = (INSTALLERS / "windows" / "learning-at-home.iss").read_text()
    sections = iss_sections(text)
    for name in ("Setup", "Files", "Icons", "Run", "UninstallRun", "Code", "InstallDelete", "Registry"):
        assert name in sections, name
    setup = dict(line.split("=", 1) for line in sections["Setup"])
    assert setup["PrivilegesRequired"] == "lowest"  # per user, no administrator rights
    assert setup["DefaultDirName"].startswith("{autopf}")  # %LOCALAPPDATA%\Programs when per user
    assert re.fullmatch(r"\{\{[0-9A-F]{8}(-[0-9A-F]{4}){3}-[0-9A-F]{12}\}", setup["AppId"])
    for key in ("AppName", "AppVersion", "OutputBaseFilename", "UninstallDisplayIcon", "SetupIconFile"):
        assert setup.get(key), key
    # Every entry line is "Key: value; Key: value" with the keys Inno knows for that section.
    for section in ("Files", "Icons", "Run", "UninstallRun", "InstallDelete", "Registry"):
        for line in sections[section]:
            keys = [part.split(":", 1)[0].strip() for part in re.split(r';\s+(?=\w+:)', line)]
            assert all(re.fullmatch(r"[A-Za-z]+", k) for k in keys), line
    assert any("{autoprograms}" in line for line in sections["Icons"])  # Start-menu entry
    assert "{#BundleDir}" in sections["Files"][0] and "recursesubdirs" in sections["Files"][0]
    # Preprocessor and Pascal blocks balance; the uninstaller asks about the data and keeps it by default.
    assert text.count("#ifndef") == text.count("#endif")
    code = "\n".join(sections["Code"])
    words = re.findall(r"\b(begin|end)\b", re.sub(r"'[^']*'|\{[^}]*\}", "", code))
    assert words.count("begin") == words.count("end")
    assert "usPostUninstall" in code and "MB_YESNO" in code and "IDYES" in code and "DelTree" in code


def test_macos_plists_and_dmg_settings() -> None:
    info = plistlib.loads((INSTALLERS / "macos" / "Info.plist").read_bytes())
    assert info["LSUIElement"] is True  # menu bar only: no Dock icon
    assert info["CFBundleExecutable"] == "learning-at-home"
    assert info["CFBundlePackageType"] == "APPL" and info["CFBundleIdentifier"].count(".") >= 2
    entitlements = plistlib.loads((INSTALLERS / "macos" / "entitlements.plist").read_bytes())
    assert all(v is True for v in entitlements.values())
    namespace: dict[str, object] = {"defines": {"app": "dist/Learning@home.app"}}
    settings = (INSTALLERS / "macos" / "dmg_settings.py").read_text()
    exec(compile(settings, "dmg_settings.py", "exec"), namespace)
    assert namespace["files"] == ["dist/Learning@home.app"]
    assert namespace["symlinks"] == {"Applications": "/Applications"}
    assert set(namespace["icon_locations"]) == {"Learning@home.app", "Applications"}  # type: ignore[arg-type]


def test_desktop_entry_and_debian_control() -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(INSTALLERS / "linux" / "learning-at-home.desktop")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Exec"] == "learning-at-home"
    assert entry["Icon"] == "learning-at-home" and entry["Terminal"] == "false"
    assert entry["Categories"].endswith(";")
    control = (INSTALLERS / "linux" / "control.in").read_text()
    fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", control, re.M))
    for key in ("Package", "Version", "Architecture", "Maintainer", "Depends", "Description"):
        assert key in fields, key
    assert all(line.startswith(" ") for line in control.split("Description:", 1)[1].splitlines()[1:] if line)


def test_no_package_writes_an_autostart_entry() -> None:
    for path in (INSTALLERS / "build-linux", INSTALLERS / "windows" / "learning-at-home.iss"):
        text = path.read_text()
        assert "autostart/" not in text.replace("~/.config/autostart/ itself", "")
        assert "CurrentVersion\\Run\"; ValueType: none" in text or path.suffix != ".iss"


def test_the_spec_compiles_and_documents_every_drop() -> None:
    text = (INSTALLERS / "learning-at-home.spec").read_text()
    compile(text, "learning-at-home.spec", "exec")
    for pattern, why in re.findall(r'\("([^"]+\*?)", "([^"]*)"', text):
        assert why, pattern
    assert '"assets"' in text and "coordinator/db/migrations" in text and "templates" in text
