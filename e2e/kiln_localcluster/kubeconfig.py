"""How a client proves who it is to the local API server: a kubeconfig per identity.

Why it exists: every component, kubectl, the operator and the tests reach the API server over
TLS with a client certificate from ``pki``; this module wraps that material into the two forms
clients take, a kubeconfig file (self-contained: the certificates are inlined) and, for this
package's own HTTP requests, an ``ssl.SSLContext`` of the admin identity.
"""

import base64
import ssl
from pathlib import Path
from typing import Any

import yaml

from kiln_localcluster import pki


def write_kubeconfig(
    directory: Path, material: pki.Pki, identity: pki.Identity, server: str
) -> Path:
    """Write ``identity``'s kubeconfig for ``server`` into ``directory`` (mode 0600)."""
    path = directory / f"{identity.name.replace(':', '-')}.kubeconfig"
    path.parent.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kiln-local",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": _b64(material.ca_cert),
                },
            }
        ],
        "users": [
            {
                "name": identity.name,
                "user": {
                    "client-certificate-data": _b64(material.client_cert(identity)),
                    "client-key-data": _b64(material.client_key(identity)),
                },
            }
        ],
        "contexts": [
            {
                "name": "kiln-local",
                "context": {
                    "cluster": "kiln-local",
                    "user": identity.name,
                },
            }
        ],
        "current-context": "kiln-local",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def admin_ssl_context(material: pki.Pki) -> ssl.SSLContext:
    """TLS towards the API server as the cluster's admin: its CA trusted, its certificate shown."""
    context = ssl.create_default_context(cafile=str(material.ca_cert))
    context.load_cert_chain(
        str(material.client_cert(pki.ADMIN)), str(material.client_key(pki.ADMIN))
    )
    return context


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()
