"""Production deployment: offline checks of the compose file, Kubernetes manifests and GPU configs
(:mod:`deploy.validate`), schema vendoring (:mod:`deploy.vendor_schemas`) and the GPU host check
(:mod:`deploy.gpu_check`)."""
