"""Root URLs: pages at /, the JSON API at /api/, login/logout at /accounts/, admin at /admin/.

`/favicon.ico` (what a browser asks for where a page names no icon, and what tools fetch)
leads to the one icon file, `static/inflight/favicon.ico`, which base.html links to.
"""

from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("inflight.api.urls")),
    path("favicon.ico", RedirectView.as_view(url=static("inflight/favicon.ico"), permanent=True)),
    path("", include("inflight.web.urls")),
]
