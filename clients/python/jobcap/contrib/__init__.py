"""Adapters for frameworks that run jobs: Celery (kombu) and Django-Q."""
