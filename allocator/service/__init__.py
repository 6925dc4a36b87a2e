"""The service: small parts behind narrow interfaces, composed in compose.py, and the
read models (views/) the adapters and the CLI show."""
