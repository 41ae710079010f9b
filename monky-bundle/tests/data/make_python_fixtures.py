"""Writes the Python-made fixtures (run once; the outputs are committed).

python-pax.tar / python-pax.tar.gz: the files under bundle/ packed the way tenancy's Python
does (tarfile, PAX format, plain arcnames), plus a PAX global header and, for bundle.json, a
PAX `path` record overriding a placeholder ustar name -- the mechanism tarfile uses for long
or non-ASCII names. Prints the protocol sha computed here with hashlib, independently of Rust.
"""

import hashlib
import io
import os
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "bundle")
NAMES = sorted(os.listdir(SRC))


def pack(mode: str, out: str) -> None:
    with tarfile.open(out, mode, format=tarfile.PAX_FORMAT, pax_headers={"comment": "monky fixture"}) as tf:
        for name in NAMES:
            data = open(os.path.join(SRC, name), "rb").read()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1757318400
            info.mode = 0o644
            if name == "bundle.json":
                info.name = "placeholder-overridden-by-pax"
                info.pax_headers = {"path": "bundle.json", "comment": "pax path record"}
            tf.addfile(info, io.BytesIO(data))


pack("w", os.path.join(HERE, "python-pax.tar"))
pack("w:gz", os.path.join(HERE, "python-pax.tar.gz"))

h = hashlib.sha256()
for name in NAMES:
    h.update(name.encode() + b"\0" + open(os.path.join(SRC, name), "rb").read() + b"\0")
print(h.hexdigest())
