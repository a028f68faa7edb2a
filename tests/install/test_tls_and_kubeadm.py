"""The installer's certificates (kept while usable, issued again when not) and the files of
`--mode kubeadm` (the scheduler config with the ClusterIP, a kubeadm patch that applies)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import jsonpatch
import yaml
from cryptography import x509

from allocator.runtime import certs as pki
from topoalloc.commands.installer import kubeadm, tls

REPO = Path(__file__).resolve().parents[2]


def test_issued_secrets_are_usable_and_chain_to_one_ca() -> None:
    files = tls.issue_secrets()
    assert tls.unusable(files) is None
    server = x509.load_pem_x509_certificate(files["topoalloc-allocator-tls"]["tls.crt"])
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "topoalloc-webhook.topoalloc-system.svc" in names.get_values_for_type(x509.DNSName)
    client = x509.load_pem_x509_certificate(files["topoalloc-scheduler-client"]["tls.crt"])
    assert client.subject.rfc4514_string() == "CN=kube-scheduler-extender-client,O=system:kube-scheduler"


def test_secrets_that_cannot_be_kept_say_why() -> None:
    good = tls.issue_secrets()
    other = tls.issue_secrets()
    mixed = {
        "topoalloc-allocator-tls": good["topoalloc-allocator-tls"],
        "topoalloc-scheduler-client": other["topoalloc-scheduler-client"],
    }
    assert tls.unusable(mixed) == "the two Secrets hold different CAs"
    missing = {"topoalloc-allocator-tls": good["topoalloc-allocator-tls"]}
    assert "topoalloc-scheduler-client is missing" in (tls.unusable(missing) or "")
    ca = pki.make_ca()
    soon = pki.issue(
        ca,
        "x",
        dns_names=["topoalloc-allocator.topoalloc-system.svc", "topoalloc-webhook.topoalloc-system.svc"],
        server=True,
        not_after=dt.datetime.now(dt.UTC) + dt.timedelta(days=3),
    )
    ending = dict(good)
    ending["topoalloc-allocator-tls"] = {
        "tls.crt": soon.cert_pem,
        "tls.key": soon.key_pem,
        "ca.crt": ca.cert_pem,
    }
    assert "certificate ends" in (tls.unusable(ending) or "")
    foreign = dict(good)
    foreign["topoalloc-allocator-tls"] = {**good["topoalloc-allocator-tls"], "ca.crt": ca.cert_pem}
    assert "holds no certificate issued by its ca.crt (InvalidSignature)" in (tls.unusable(foreign) or "")


KUBEADM_SCHEDULER = """
apiVersion: v1
kind: Pod
metadata: {name: kube-scheduler, namespace: kube-system}
spec:
  containers:
  - name: kube-scheduler
    image: registry.k8s.io/kube-scheduler:v1.35.6
    command: [kube-scheduler, --authentication-kubeconfig=/etc/kubernetes/scheduler.conf,
              --bind-address=127.0.0.1, --kubeconfig=/etc/kubernetes/scheduler.conf, --leader-elect=true]
    volumeMounts:
    - {mountPath: /etc/kubernetes/scheduler.conf, name: kubeconfig, readOnly: true}
  hostNetwork: true
  volumes:
  - hostPath: {path: /etc/kubernetes/scheduler.conf, type: FileOrCreate}
    name: kubeconfig
"""


def test_the_kubeadm_patch_applies_to_kubeadms_static_pod(tmp_path: Path) -> None:
    client = tls.issue_secrets()["topoalloc-scheduler-client"]
    written = kubeadm.write(tmp_path, kubeadm.files(REPO, "10.96.0.17", client))
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        "kube-scheduler-config.yaml",
        "ca.crt",
        "client.crt",
        "client.key",
        "patches/kube-scheduler+json.json",
    }
    assert (tmp_path / "client.key").stat().st_mode & 0o077 == 0
    pod = jsonpatch.apply_patch(
        yaml.safe_load(KUBEADM_SCHEDULER),
        json.loads((tmp_path / "patches/kube-scheduler+json.json").read_text()),
    )
    container = pod["spec"]["containers"][0]
    assert container["command"][-1] == "--config=/etc/kubernetes/topoalloc/kube-scheduler-config.yaml"
    mount = container["volumeMounts"][-1]
    volume = pod["spec"]["volumes"][-1]
    assert mount["mountPath"] == volume["hostPath"]["path"] == "/etc/kubernetes/topoalloc"
    config = yaml.safe_load((tmp_path / "kube-scheduler-config.yaml").read_text())
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://10.96.0.17:8443"
    assert extender["tlsConfig"]["serverName"] == "topoalloc-allocator.topoalloc-system.svc"
    # The files the config names are the ones written, under the folder they are copied to.
    for key in ("caFile", "certFile", "keyFile"):
        name = Path(extender["tlsConfig"][key]).name
        assert (
            extender["tlsConfig"][key] == f"/etc/kubernetes/topoalloc/{name}" and (tmp_path / name).is_file()
        )


def test_an_ipv6_cluster_ip_is_bracketed() -> None:
    assert "https://[fd00:10:96::a]:8443" in kubeadm.scheduler_config(REPO, "fd00:10:96::a")
