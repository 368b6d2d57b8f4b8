"""The web UI, mounted at the site root by `ledger.urls`."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path(
        "login",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("account", views.account, name="account"),
    path("orders", views.orders_page, name="order-list"),
    path("orders/new", views.order_new, name="order-new"),
    path(
        "orders/<str:merchant_order_no>/cancel",
        views.order_cancel_view,
        name="order-cancel",
    ),
]
