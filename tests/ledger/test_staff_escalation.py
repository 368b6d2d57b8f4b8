"""Staff who may manage users or groups (`change_user`, `change_group`) are not
thereby superusers: they cannot make anyone (themselves included) a superuser or
staff, grant permissions or groups, nor change, or set the password of, a staff
account, which would let them log in as someone who may do more."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

pytestmark = pytest.mark.django_db

User = get_user_model()
USERS = "/admin/auth/user/"
PASSWORD = "a-long-new-pass-9"


def member(username: str, *permissions: str, **flags) -> tuple:
    user = User.objects.create_user(username, password="old-pass-123", **flags)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    browser = Client(raise_request_exception=False)
    browser.force_login(user)
    return user, browser


def change_form(user, **changes) -> dict:
    return {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        **changes,
    }


def test_a_user_manager_cannot_raise_anyone():
    clerk, browser = member("clerk", "view_user", "change_user", is_staff=True)
    alice = User.objects.create_user("alice")
    credit = Permission.objects.get(codename="add_journalentry")
    grants = {
        "is_staff": "on",
        "is_superuser": "on",
        "user_permissions": [str(credit.pk)],
    }
    for target in (clerk, alice):
        browser.post(
            f"{USERS}{target.pk}/change/",
            change_form(target, first_name="Changed", **grants),
        )
        target.refresh_from_db()
        assert (
            not target.is_superuser
            and not target.user_permissions.filter(pk=credit.pk).exists()
        )
    assert not alice.is_staff
    assert alice.first_name == "Changed"  # a customer's own details stay theirs to edit


def test_a_user_manager_cannot_take_over_a_staff_account():
    _, browser = member("clerk", "view_user", "change_user", is_staff=True)
    root = User.objects.create_superuser("root", password="old-pass-123")
    answer = browser.post(
        f"{USERS}{root.pk}/password/",
        {"password1": PASSWORD, "password2": PASSWORD, "usable_password": "true"},
    )
    assert answer.status_code == 403
    root.refresh_from_db()
    assert root.check_password("old-pass-123")
    changed = browser.post(
        f"{USERS}{root.pk}/change/", change_form(root, username="taken")
    )
    assert changed.status_code == 403
    assert User.objects.filter(username="root").exists()


def test_a_group_manager_cannot_grant_permissions():
    clerk, browser = member("clerk", "view_group", "change_group", is_staff=True)
    group = Group.objects.create(name="desk")
    clerk.groups.add(group)
    credit = Permission.objects.get(codename="add_journalentry")
    browser.post(
        f"/admin/auth/group/{group.pk}/change/",
        {"name": "desk", "permissions": [str(credit.pk)]},
    )
    assert not group.permissions.exists()
    clerk = User.objects.get(pk=clerk.pk)
    assert not clerk.has_perm("ledger.add_journalentry")


def test_a_user_manager_cannot_delete_a_staff_account_in_bulk():
    _, browser = member("clerk", "view_user", "delete_user", is_staff=True)
    root = User.objects.create_superuser("root", password="old-pass-123")
    alice = User.objects.create_user("alice")
    selection = {"action": "delete_selected", "_selected_action": [root.pk, alice.pk]}
    asked = browser.post(USERS, selection)
    assert "Cannot delete" in asked.content.decode()
    browser.post(USERS, {**selection, "post": "yes"})
    assert User.objects.filter(pk=root.pk).exists()
    assert User.objects.filter(pk=alice.pk).exists()  # all or nothing
    assert browser.post(f"{USERS}{root.pk}/delete/", {"post": "yes"}).status_code == 403
    assert User.objects.filter(pk=root.pk).exists()
