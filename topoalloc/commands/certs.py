"""`topoalloc certs`: mint the extender's PKI (CA, allocator server cert, scheduler client cert)."""

from __future__ import annotations

import base64
import ipaddress
import re
import shutil
import subprocess
from pathlib import Path

import click
import yaml

from allocator.runtime import certs as pki
from allocator.runtime.admission_settings import WEBHOOK_SERVICE
from allocator.runtime.config import DEFAULT_NAMESPACE, DEFAULT_SERVICE
from topoalloc.errors import BadInput

SERVER_SECRET = "topoalloc-allocator-tls"
CLIENT_SECRET = "topoalloc-scheduler-client"


def secret_manifest(name: str, namespace: str, files: dict[str, bytes]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "topoalloc"},
        },
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }


_DNS_LABEL = r"(\*|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)"
_DNS_NAME = re.compile(rf"^{_DNS_LABEL}(\.[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?)*$")


def _ip_list(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not an IPv4 or IPv6 address") from None
    return values


def _dns_list(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if len(value) > 253 or not _DNS_NAME.match(value):
            raise click.BadParameter(
                f"{value!r} is not a DNS name (lowercase labels, e.g. allocator.example.com)"
            )
    return values


@click.command("certs")
@click.option(
    "--out-dir",
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="Where to write the PEM files.",
)
@click.option("--service", default=DEFAULT_SERVICE, show_default=True, help="The allocator's Service name.")
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True, help="The allocator's namespace.")
@click.option(
    "--cluster-domain",
    default="cluster.local",
    show_default=True,
    help="The cluster's DNS domain (server SANs).",
)
@click.option(
    "--dns",
    "extra_dns",
    multiple=True,
    callback=_dns_list,
    help="Extra DNS SAN for the server cert (repeatable).",
)
@click.option(
    "--ip",
    "ips",
    multiple=True,
    callback=_ip_list,
    help="IP SAN for the server cert (repeatable), e.g. 127.0.0.1.",
)
@click.option(
    "--server-cn",
    default="",
    help="Common name of the server certificate.  [default: SERVICE.NAMESPACE.svc]",
)
@click.option(
    "--ca-cn",
    default=pki.CA_CN,
    show_default=True,
    help="Common name of a new CA (ignored with --ca-cert).",
)
@click.option(
    "--client-cn",
    default=pki.SCHEDULER_CLIENT_CN,
    show_default=True,
    help="Common name of the scheduler's client certificate (put it in --allow-client).",
)
@click.option(
    "--client-org",
    default=pki.SCHEDULER_CLIENT_ORG,
    show_default=True,
    help="Organization (O) of the scheduler's client certificate; empty for none.",
)
@click.option(
    "--days",
    type=click.IntRange(1),
    default=365,
    show_default=True,
    help="Validity of the server and client certificates, in days.",
)
@click.option(
    "--ca-days",
    type=click.IntRange(1),
    default=3650,
    show_default=True,
    help="Validity of a new CA, in days.",
)
@click.option(
    "--ca-cert",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Reuse this CA (with --ca-key) instead of creating one, e.g. to rotate leaves.",
)
@click.option(
    "--ca-key",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The private key of --ca-cert (PEM, unencrypted ECDSA); it must match the certificate.",
)
@click.option(
    "--scheduler-namespace",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace of the scheduler's client Secret in --secrets-yaml (the secondary scheduler's).",
)
@click.option(
    "--secrets-yaml",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write both Secrets as a manifest for `kubectl apply -f`.",
)
@click.option("--force", is_flag=True, help="Overwrite existing files.")
def certs(
    out_dir: Path,
    service: str,
    namespace: str,
    cluster_domain: str,
    extra_dns: tuple[str, ...],
    ips: tuple[str, ...],
    server_cn: str,
    ca_cn: str,
    client_cn: str,
    client_org: str,
    days: int,
    ca_days: int,
    ca_cert: Path | None,
    ca_key: Path | None,
    scheduler_namespace: str,
    secrets_yaml: Path | None,
    force: bool,
) -> None:
    """Generate the CA, the allocator's server certificate (SANs for the Service DNS names) and
    kube-scheduler's client certificate.

    \b
    Files: ca.crt ca.key  tls.crt tls.key (server)  client.crt client.key (scheduler)
    """
    if (ca_cert is None) != (ca_key is None):
        raise click.UsageError("--ca-cert and --ca-key go together")
    names = ["tls.crt", "tls.key", "client.crt", "client.key"] + ([] if ca_cert else ["ca.crt", "ca.key"])
    clash = [n for n in names if (out_dir / n).exists()]
    if clash and not force:
        raise BadInput("output folder", str(out_dir), f"{', '.join(clash)} already exist (use --force)")
    try:
        ca = pki.Issued.load_ca(ca_cert, ca_key) if ca_cert and ca_key else pki.make_ca(ca_cn, days=ca_days)
    except pki.CertError as exc:
        raise BadInput(exc.what, exc.where, exc.why) from None
    if not ca_cert:
        ca.write(out_dir / "ca.crt", out_dir / "ca.key")
    # The same certificate serves the gang admission webhook behind its own Service.
    webhook_dns = pki.service_dns_names(WEBHOOK_SERVICE, namespace, cluster_domain)
    extra_dns = (*webhook_dns, *extra_dns)
    server = pki.server_cert(
        ca,
        service,
        namespace,
        cluster_domain=cluster_domain,
        extra_dns=extra_dns,
        ip_addresses=ips,
        days=days,
        common_name=server_cn,
    )
    server.write(out_dir / "tls.crt", out_dir / "tls.key")
    client = pki.scheduler_client_cert(ca, common_name=client_cn, organization=client_org or None, days=days)
    client.write(out_dir / "client.crt", out_dir / "client.key")
    if secrets_yaml:
        docs = [
            secret_manifest(
                SERVER_SECRET,
                namespace,
                {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem},
            ),
            secret_manifest(
                CLIENT_SECRET,
                scheduler_namespace,
                {"tls.crt": client.cert_pem, "tls.key": client.key_pem, "ca.crt": ca.cert_pem},
            ),
        ]
        secrets_yaml.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        secrets_yaml.chmod(0o600)
    keys = [out_dir / n for n in names if n.endswith(".key")] + ([secrets_yaml] if secrets_yaml else [])
    for line in unignored_private_keys(keys):
        click.echo(f"warning: {line}", err=True)
    sans = ", ".join(pki.service_dns_names(service, namespace, cluster_domain) + list(extra_dns) + list(ips))
    click.echo(f"CA          {out_dir / 'ca.crt'}{' (reused)' if ca_cert else ''}")
    click.echo(
        f"server      {out_dir / 'tls.crt'}  subject: {server.cert.subject.rfc4514_string()}  SANs: {sans}"
    )
    click.echo(f"scheduler   {out_dir / 'client.crt'}  subject: O={client_org}, CN={client_cn}")
    if secrets_yaml:
        where = f"{namespace}/{SERVER_SECRET}, {scheduler_namespace}/{CLIENT_SECRET}"
        click.echo(f"secrets     {secrets_yaml}  ({where})")


def unignored_private_keys(paths: list[Path]) -> list[str]:
    """One sentence when private-key files were written inside a git work tree that git would offer
    to commit (not ignored): a CA key in a repository is a key anyone with the repository holds."""
    git = shutil.which("git")
    if git is None or not paths:
        return []

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        folder = str(paths[0].resolve().parent)
        return subprocess.run([git, "-C", folder, *args], capture_output=True, text=True, timeout=30)

    top = run("rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return []  # not in a work tree
    exposed = [p for p in paths if run("check-ignore", "-q", str(p.resolve())).returncode != 0]
    if not exposed:
        return []
    names = ", ".join(str(p) for p in exposed)
    return [
        f"{names}: private keys inside the git work tree {top.stdout.strip()}, not ignored by git; "
        "add the folder to .gitignore or write the keys outside the repository"
    ]
