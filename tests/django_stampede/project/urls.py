from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("page/", views.page),
    path("fragment/", views.fragment),
    path("aside/", views.aside),
    path("async-report/", views.async_report),
    path("broken/", views.broken),
    path("async-page/", views.async_page),
    path("stock-async-page/", views.stock_async_page),
    path("sync-page/", views.sync_page),
    path("ping/", views.ping),
    path("state/", views.state),
]
