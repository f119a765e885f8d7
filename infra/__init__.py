"""Clouds: one provider interface (AWS via boto3, GCP via google-cloud-compute), the
provisioner, and the embedded local cloud. Submodules import their SDKs; this one imports nothing."""
