"""Certificates made at test time: a CA and the certificates it signs, as PEM files.

The secured broker (devtools.kafka_secured) serves TLS with a certificate signed by such a CA,
and clients trust it through `ssl.ca.location`. A second, unrelated CA is how tests present
"a CA that did not sign the broker's certificate". Nothing is fetched or kept: keys live in
the test's folder and die with it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class CertificateFiles:
    """A certificate and its private key (unencrypted PKCS#8), each a PEM file."""

    certificate: Path
    key: Path

    def bundle(self, path: Path) -> Path:
        """Key and certificate in one PEM file: what Kafka's broker reads as a PEM key store."""
        path.write_bytes(self.key.read_bytes() + self.certificate.read_bytes())
        path.chmod(0o600)
        return path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write(folder: Path, name: str, certificate: x509.Certificate, key: rsa.RSAPrivateKey) -> CertificateFiles:
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return CertificateFiles(cert_path, key_path)


def make_ca(folder: str | Path, name: str = "ca", common_name: str = "airflow-exactly-once test CA") -> CertificateFiles:
    """A self-signed certificate authority."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _write(Path(folder), name, certificate, key)


def make_server_certificate(ca: CertificateFiles, folder: str | Path, name: str = "broker",
                            hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> CertificateFiles:
    """A server certificate signed by `ca`, valid for `hosts` (IP addresses and DNS names) as SANs,
    so that clients verifying host names (Python's ssl, Java's https endpoint identification) accept it."""
    ca_cert = x509.load_pem_x509_certificate(ca.certificate.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = _key()
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                              x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _write(Path(folder), name, certificate, key)
