"""Only the compiled extension; everything else about the package is in pyproject.toml.

``optional=True``: where OpenSSL's headers or a compiler are missing the install goes on with a warning
and the node runs the Python record path (engine/p2p/native says why, in About and --self-test).
OPENSSL_DIR points at an OpenSSL 3 tree where it is not in the compiler's default paths (macOS
Homebrew, Windows).
"""

import os
import sys

from setuptools import Extension, setup

# engine/p2p/native/records.h draws these files' layers and what each exports.
SOURCES = ("_records", "dtls_record", "sctp_calls", "sctp_packet", "sctp_burst", "sctp_receive", "sctp_send")
openssl = os.environ.get("OPENSSL_DIR")
setup(
    ext_modules=[
        Extension(
            "engine.p2p.native._records",
            [f"engine/p2p/native/{name}.c" for name in SOURCES],
            # Windows: OpenSSL's import library is libcrypto, and sendto/inet_pton live in Winsock.
            libraries=["libcrypto", "ws2_32"] if sys.platform == "win32" else ["crypto"],
            include_dirs=[os.path.join(openssl, "include")] if openssl else [],
            library_dirs=[os.path.join(openssl, "lib")] if openssl else [],
            depends=["engine/p2p/native/records.h", "engine/p2p/native/sctp_packet.h"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O2", "-Wall", "-fvisibility=hidden"],
            optional=True,
        )
    ]
)
