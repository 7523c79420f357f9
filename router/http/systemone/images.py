"""Images on the System One wire: the body's ``images`` (data URLs, or objects with
``content_type`` and ``base64``), as the example server takes them; a multipart form's image
parts are read in ``body``. They are shown ahead of the state, to a fast tier that reads images
and to the slow model."""

from __future__ import annotations

from typing import Any

from router.http.systemone.errors import SystemOneError


def json_images(value: Any) -> tuple[str, ...]:
    """The body's ``images`` as data URLs: each a ``data:image/...`` URL or an object with
    ``content_type`` (``image/...``) and ``base64``, as the server takes them."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SystemOneError("images: must be a list of data:image/... URLs", field="images")
    urls = []
    for i, image in enumerate(value):
        if isinstance(image, str) and image.startswith("data:image/"):
            urls.append(image)
        elif (isinstance(image, dict) and isinstance(image.get("content_type"), str)
              and image["content_type"].startswith("image/")
              and isinstance(image.get("base64"), str)):
            urls.append(f"data:{image['content_type']};base64,{image['base64']}")
        else:
            raise SystemOneError(f"images[{i}]: a data:image/... URL or an object with "
                                  "content_type and base64", field=f"images.{i}")
    return tuple(urls)
