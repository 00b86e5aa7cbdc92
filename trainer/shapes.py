"""A deterministic synthetic COCO dataset of simple shapes, for the demo and the tests.

Each image holds 1-3 filled shapes (rectangle, ellipse, triangle) in random colours on a noisy
background. Boxes are exact: they are the bounding boxes of the pixels each shape covers after
occlusion by later shapes. The same seed gives byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("rectangle", "ellipse", "triangle")


def _shape_mask(size: int, kind: str, box: tuple[int, int, int, int]) -> np.ndarray:
    mask = Image.new("1", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    x0, y0, x1, y1 = box
    if kind == "rectangle":
        draw.rectangle(box, fill=1)
    elif kind == "ellipse":
        draw.ellipse(box, fill=1)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=1)
    return np.array(mask, dtype=bool)


def _make_image(size: int, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, list]]]:
    base = rng.integers(0, 256, size=3)
    pixels = np.clip(base + rng.normal(0, 12, size=(size, size, 3)), 0, 255)
    owner = np.full((size, size), -1, dtype=np.int64)
    shapes = []
    for index in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, len(CLASSES)))
        w, h = (int(v) for v in rng.integers(size // 6, size // 2, size=2))
        x0 = int(rng.integers(0, size - w))
        y0 = int(rng.integers(0, size - h))
        mask = _shape_mask(size, CLASSES[kind], (x0, y0, x0 + w - 1, y0 + h - 1))
        colour = rng.integers(0, 256, size=3)
        # Keep shapes visible against the background.
        if np.abs(colour - base).sum() < 120:
            colour = (base + 128) % 256
        pixels[mask] = colour
        owner[mask] = index
        shapes.append(kind)
    objects = []
    for index, kind in enumerate(shapes):
        ys, xs = np.nonzero(owner == index)
        if len(xs) < 16:  # hidden behind later shapes: not an object any more
            continue
        x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
        objects.append((kind, [x0, y0, x1 - x0, y1 - y0]))
    return pixels.astype(np.uint8), objects


def make_shapes(
    out: str | Path, train: int = 256, val: int = 32, seed: int = 0, size: int = 128
) -> dict[str, Path]:
    """Write ``train/``, ``val/`` image folders and ``train.json``, ``val.json`` under ``out``.

    Returns the paths: ``train_json``, ``train_images``, ``val_json``, ``val_images``.
    """
    out = Path(out)
    rng = np.random.default_rng(seed)
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(CLASSES)]
    paths: dict[str, Path] = {}
    ann_id = 1
    for split, count in (("train", train), ("val", val)):
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for image_id in range(1, count + 1):
            pixels, objects = _make_image(size, rng)
            file_name = f"{image_id:06d}.png"
            Image.fromarray(pixels).save(folder / file_name)
            images.append({"id": image_id, "file_name": file_name, "width": size, "height": size})
            for kind, box in objects:
                annotations.append(
                    {
                        "id": ann_id,
                        "image_id": image_id,
                        "category_id": kind + 1,
                        "bbox": box,
                        "area": box[2] * box[3],
                        "iscrowd": 0,
                    }
                )
                ann_id += 1
        json_path = out / f"{split}.json"
        json_path.write_text(
            json.dumps({"images": images, "annotations": annotations, "categories": categories})
        )
        paths[f"{split}_json"] = json_path
        paths[f"{split}_images"] = folder
    return paths
