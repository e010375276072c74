"""The PySide6 tray app (a later issue). It will import ``engine``'s public API only, never the reverse."""
