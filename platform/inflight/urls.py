"""Root URLs: pages at /, the JSON API at /api/, login/logout at /accounts/, admin at /admin/."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("inflight.api.urls")),
    path("", include("inflight.web.urls")),
]
