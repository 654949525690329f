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
    path("", include("inflight.accounts.urls")),
    path("", include("inflight.inbox.urls")),
    path("", include("inflight.datasets.urls")),
    path("", include("inflight.web.urls")),
]

# An address nothing answers gets the site's 404 page (or the API's JSON error), not Django's.
handler404 = "inflight.web.views.page_not_found"
