"""Service plumbing shared between services: identities, TLS material, secrets helpers."""
