"""Handler for every image model packaged from its folder, of whatever kind the archive holds: an image classifier
(any folder transformers' AutoModelForImageClassification loads).

The kind is what the packaging step recorded in the archive's ``image_model.json`` (read from the folder itself,
handlers/image/kinds/); everything else is the one image-model path, :class:`handlers.image.handler.ImageModelHandler`.
"""

from __future__ import annotations

from handlers.image.handler import ImageModelHandler


class ImageHandler(ImageModelHandler):
    kind_name = None
