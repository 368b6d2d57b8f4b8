import pytest

from orders.models import Order
from payments.services import payment_pay_with_balance
from tests.helpers import customer, place_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(admin_client):
    return admin_client


def test_order_admin_lists_filters_and_searches(staff):
    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user, description="Jasmine")
    page = staff.get("/admin/orders/order/?status__exact=10&q=Jasmine")
    assert page.status_code == 200
    content = page.content.decode()
    assert order.merchant_order_no in content
    assert "cancel, pay" in content  # available transitions
    assert staff.get(f"/admin/orders/order/{order.pk}/change/").status_code == 200
    assert staff.get("/admin/orders/preorder/").status_code == 200
    assert staff.get("/admin/payments/payment/").status_code == 200


def test_admin_actions_take_only_legal_transitions(staff):
    user, _, _ = customer("alice", balance=10_000)
    pending, paid = place_order(user), place_order(user)
    payment_pay_with_balance(order_id=paid.pk)
    response = staff.post(
        "/admin/orders/order/",
        {"action": "ship", "_selected_action": [pending.pk, paid.pk]},
        follow=True,
    )
    assert response.status_code == 200
    pending.refresh_from_db()
    paid.refresh_from_db()
    assert pending.status == Order.Status.PENDING_PAYMENT  # refused, with a warning
    assert paid.status == Order.Status.SHIPPED
    messages = [str(m) for m in response.context["messages"]]
    assert any("cannot ship" in m for m in messages), messages
    staff.post(
        "/admin/orders/order/",
        {"action": "cancel", "_selected_action": [pending.pk, paid.pk]},
    )
    pending.refresh_from_db()
    paid.refresh_from_db()
    assert (pending.status, paid.status) == (
        Order.Status.CANCELLED,
        Order.Status.SHIPPED,
    )


def test_payments_are_read_only_in_the_admin(staff):
    user, _, _ = customer("alice", balance=10_000)
    payment = payment_pay_with_balance(order_id=place_order(user).pk)
    url = f"/admin/payments/payment/{payment.pk}/change/"
    assert staff.get(url).status_code == 200
    assert b'name="_save"' not in staff.get(url).content
