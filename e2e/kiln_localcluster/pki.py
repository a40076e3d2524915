"""Certificates and keys for the local control plane.

Why it exists: a real API server serves TLS, authenticates clients by certificate and signs
service-account tokens; the components need a CA, a serving certificate, one client certificate
per identity and a service-account key pair. Everything is written once per cluster directory.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Identity:
    """A client identity: its user name and groups (the certificate's CN and O fields)."""

    name: str
    groups: tuple[str, ...] = ()


# Who talks to the API server, with the identities the bootstrap RBAC policy expects.
ADMIN = Identity("kiln-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")
KWOK = Identity("kwok-controller", ("system:masters",))
# The real node's agents: the Node authorizer knows a kubelet by this name and group, and the
# bootstrap policy binds `system:node-proxier` to kube-proxy's user.
NODE_NAME = "kiln-node"
KUBELET = Identity(f"system:node:{NODE_NAME}", ("system:nodes",))
KUBE_PROXY = Identity("system:kube-proxy")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Pki:
    """File paths of the material one cluster uses."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, identity: Identity) -> Path:
        return self.directory / f"{identity.name.replace(':', '-')}.crt"

    def client_key(self, identity: Identity) -> Path:
        return self.directory / f"{identity.name.replace(':', '-')}.key"


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def create_pki(
    directory: Path,
    identities: list[Identity],
    now: datetime.datetime,
    *,
    service_ip: str | None = None,
) -> Pki:
    """Write a CA, the API server's serving certificate, client certificates and the SA key pair.

    ``service_ip``: the `kubernetes` Service's cluster IP, which in-cluster clients connect to."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln-local-ca")])
    ca_cert = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, now, ca=True)
    pki.ca_key.write_bytes(_pem_key(ca_key))
    pki.ca_cert.write_bytes(_pem_cert(ca_cert))

    serving_key = _key()
    sans: list[x509.GeneralName] = [
        x509.DNSName(name)
        for name in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    if service_ip is not None:
        sans.append(x509.IPAddress(ipaddress.ip_address(service_ip)))
    serving = _sign(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        serving_key.public_key(),
        ca_name,
        ca_key,
        now,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
    )
    pki.serving_key.write_bytes(_pem_key(serving_key))
    pki.serving_cert.write_bytes(_pem_cert(serving))

    for identity in identities:
        key = _key()
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.name))
        cert = _sign(
            x509.Name(attributes),
            key.public_key(),
            ca_name,
            ca_key,
            now,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        pki.client_key(identity).write_bytes(_pem_key(key))
        pki.client_cert(identity).write_bytes(_pem_cert(cert))

    sa_key = _key()
    pki.service_account_key.write_bytes(_pem_key(sa_key))
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for path in directory.iterdir():
        if path.suffix == ".key":
            path.chmod(0o600)
    return pki
