"""A real Kubernetes control plane on this machine, for Kiln's tests and demo.

Why it exists: kind needs an image registry, which some machines cannot reach, and a mocked API
server lets a broken operator pass. This package starts the upstream binaries as plain processes
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler) plus kwok, which plays the
kubelets of fake GPU nodes — the approach of controller-runtime's envtest and kwokctl's binary
runtime. It never touches a process it did not start.
"""
