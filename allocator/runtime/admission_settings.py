"""Settings of the allocator's admission server (the `admission:` block of its config): the one
HTTPS server every component's webhook route is served on (allocator/runtime/admission_server.py)."""

from __future__ import annotations

from dataclasses import dataclass

# deploy/allocator/webhook.yaml: the Service in front of every allocator replica's webhook port,
# and the MutatingWebhookConfiguration whose caBundle the leader keeps equal to its CA.
WEBHOOK_SERVICE = "topoalloc-webhook"
# deploy/allocator/service.yaml: the extender's Service, whose one endpoint is the leader; the
# placement route is called through it (its webhook port), where pods are placed at admission.
LEADER_SERVICE = "topoalloc-allocator"
WEBHOOK_CONFIGURATION = "topoalloc-gang"
# Keys of the `gang:` block that were the admission server's before it had a block of its own:
# still read (into `admission:`, unless that block sets the same key), with a warning.
DEPRECATED_GANG_KEYS = {
    "webhookHost": "host",
    "webhook_host": "host",
    "webhookPort": "port",
    "webhook_port": "port",
    "webhookConfiguration": "webhookConfiguration",
    "webhook_configuration": "webhookConfiguration",
}


@dataclass
class AdmissionSettings:
    # HTTPS with the allocator's certificate, no client certificate (kube-apiserver presents none).
    host: str = "0.0.0.0"
    port: int = 9443
    # The leader writes the CA of its TLS files (`clientCa`, the Secret's ca.crt, which signed its
    # certificate) into this configuration's caBundle for webhooks calling WEBHOOK_SERVICE or
    # LEADER_SERVICE; ""
    # leaves the caBundle to someone else (cert-manager's CA injector).
    webhook_configuration: str = WEBHOOK_CONFIGURATION
