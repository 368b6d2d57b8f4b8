"""The web UI's Pay-with-provider button: to the provider's pay page, once."""

import pytest

from payments.models import Payment
from payments.provider.models import Charge
from tests.helpers import customer, place_order

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_provider_button_leads_to_one_pay_page(client, provider, settings):
    user, _, _ = customer("alice")
    client.force_login(user)
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    assert b'id="pay-provider"' in client.get(url).content
    first = client.post(f"{url}/pay", {"method": "provider"})
    assert first.status_code == 303
    assert first["Location"].startswith(f"{provider}/provider/pay/")
    again = client.post(f"{url}/pay", {"method": "provider"})  # a second click
    assert again["Location"] == first["Location"]
    assert Payment.objects.count() == 1 and Charge.objects.count() == 1
    page = client.get(url)
    assert first["Location"].encode() in page.content  # "Continue to the pay page"

    settings.PAYMENT_PROVIDER_URL = "http://127.0.0.1:9/provider"  # nobody there
    other = place_order(user, amount=100)
    down = client.post(f"/orders/{other.merchant_order_no}/pay", {"method": "provider"})
    assert down.status_code == 303
    assert down["Location"] == f"/orders/{other.merchant_order_no}"
