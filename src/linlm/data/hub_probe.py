"""Whether the Hugging Face hub can be reached, asked once per process in a few seconds.

Without a network, ``datasets`` and ``huggingface_hub`` retry each request with back-off, about 30 s before they give
up; linlm opens one TCP connection to the hub's endpoint first (``HF_ENDPOINT``, default huggingface.co:443) and,
when none opens within :data:`PROBE_SECONDS`, says so at once with the offline route. Behind a proxy
(``HTTPS_PROXY``, ``ALL_PROXY``) the direct connection says nothing, so no probe is made there.
"""

from __future__ import annotations

import os
import socket
from typing import Optional
from urllib.parse import urlparse

PROBE_SECONDS = 3.0
OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
_probed: dict[tuple[str, int], Optional[str]] = {}


def offline() -> bool:
    """Whether the environment asks for no network (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set to 1, true, yes or
    on, as datasets and huggingface_hub read them)."""
    return any(os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE") for k in OFFLINE_ENV)


def hub_unreachable(timeout: float = PROBE_SECONDS) -> Optional[str]:
    """Why the hub cannot be reached (a few words), or None when a connection to it opened (or a proxy is set, and
    the libraries' own requests decide). The answer is kept for the rest of the process."""
    if any(os.environ.get(k) for k in PROXY_ENV):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    if (host, port) not in _probed:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            _probed[host, port] = None
        except OSError as e:
            _probed[host, port] = f"no connection to {host}:{port} within {timeout:g} s: {e.strerror or e}"
    return _probed[host, port]


def check_hub_source(spec: str, name: str) -> None:
    """Refuse (DataError) the source ``spec`` of the hub dataset ``name`` when the hub cannot be reached, before
    datasets retries for half a minute; a local path, or HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set (datasets' own
    cache), asks no network and passes."""
    from pathlib import Path

    from linlm.errors import DataError

    if offline() or Path(name).expanduser().exists():
        return
    why = hub_unreachable()
    if why:
        raise DataError(f"source {spec!r}: the dataset hub cannot be reached ({why}). Offline: save the text where "
                        "the hub can be reached and pass that file or directory as the source (as `linlm eval fetch` "
                        "does for the zero-shot tasks), or set HF_DATASETS_OFFLINE=1 to read a dataset already in "
                        "datasets' cache")
