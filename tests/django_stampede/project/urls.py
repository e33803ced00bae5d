from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("page/", views.page),
    path("fragment/", views.fragment),
    path("aside/", views.aside),
    path("async-report/", views.async_report),
    path("broken/", views.broken),
]
