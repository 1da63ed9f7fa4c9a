"""Kubernetes: putting the sidecar into agent pods.

``redirect`` builds the iptables rules the transparent-mode init container installs;
``config`` is the injection configuration (image, secrets, resources; YAML);
``annotations`` reads and validates a pod's ``effect-sidecar.io/*`` annotations;
``shape`` checks the fields injection reads hold what they should (a clear refusal, not a
crash, for a container that is null or ``env`` that is a string);
``containers`` builds what a pod gets (the sidecar and redirect containers, volumes, app
variables); ``inject`` decides whether and where it goes, for a Pod or a workload manifest
(pure: dicts in, dicts out, no I/O); ``webhook`` serves that as a mutating admission
webhook. Its self-signed TLS mode is ``selfsigned`` (the Secret, the files, the
``caBundle``), on ``certgen`` (the CA and certificate, pure), ``certfiles`` (the pair on
disk) and ``apiclient`` (the few Kubernetes API calls). ``sidecar redirect``,
``sidecar inject`` (offline, like ``istioctl kube-inject``) and ``sidecar webhook`` are
the verbs.
"""
