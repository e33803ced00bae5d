from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("report/", views.report, name="report"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("products/<int:pk>/", views.product, name="product"),
    path("products/<int:pk>/edit/", views.edit_product, name="edit_product"),
]
