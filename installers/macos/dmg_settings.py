"""dmgbuild settings for the macOS disk image: the app and a link to /Applications, side by side.

    dmgbuild -s installers/macos/dmg_settings.py -D app="dist/Learning@home.app" \\
        "Learning@home" dist/learning-at-home-VERSION-macos-arm64.dmg

dmgbuild executes this file with ``defines`` (the ``-D`` values) in its namespace.
"""

import os.path

defines: dict[str, str] = globals().get("defines", {})  # set by dmgbuild
application = defines.get("app", "dist/Learning@home.app")
appname = os.path.basename(application)

format = "UDZO"  # zlib-compressed, read-only; readable by every supported macOS
compression_level = 9
filesystem = "APFS"
files = [application]
symlinks = {"Applications": "/Applications"}
badge_icon = None
icon_locations = {appname: (140, 160), "Applications": (400, 160)}
background = "builtin-arrow"
window_rect = ((200, 120), (540, 340))
default_view = "icon-view"
show_icon_preview = False
show_status_bar = False
show_tab_view = False
show_toolbar = False
show_pathbar = False
show_sidebar = False
icon_size = 128
text_size = 13
