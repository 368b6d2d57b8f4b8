import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledger.settings")

application = get_wsgi_application()

# gunicorn's own refusals (a bad header, a request line too long) as problem+json.
from .server_errors import install  # noqa: E402

install()
