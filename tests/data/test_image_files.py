"""Reading a user's image files: which are images, their headers, the one colour kind a data
set shares, decoding with the center crop and resize, and an npz's arrays checked; every
failure one DataError naming the file. Provenance: Pillow itself (the images are written by
it and read back), and the module's documented rules. (Whole folders and npz files through
ImageCorpus: tests/data/test_images.py; a path without images is refused here, through it.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from addnorm.data.fingerprint import DataError
from addnorm.data.image_files import (
    SHOWN,
    ImageHeader,
    checked_labels,
    common_mode,
    decode_file,
    empty_class_folders,
    fit_image,
    image_suffixes,
    is_image_name,
    named_examples,
    read_header,
    read_npz,
)
from addnorm.data.images import ImageCorpus


def test_image_names_are_those_of_formats_pillow_opens_in_any_case():
    assert {".png", ".jpg", ".jpeg", ".bmp", ".gif"} <= image_suffixes()
    assert is_image_name(Path("a/b.PNG")) and is_image_name(Path("c.jpg"))
    assert not is_image_name(Path("notes.txt")) and not is_image_name(Path("png"))


def test_a_header_gives_pillow_s_mode_and_size_and_a_non_image_is_named(tmp_path):
    Image.new("RGB", (12, 7)).save(tmp_path / "a.png")
    assert read_header(tmp_path / "a.png") == ImageHeader("RGB", (12, 7))
    (tmp_path / "b.png").write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"b\.png: cannot be decoded as an image"):
        read_header(tmp_path / "b.png")


def test_one_kind_of_image_is_kept_and_mixed_or_16_bit_modes_are_refused():
    gray, colour = ImageHeader("L", (4, 4)), ImageHeader("P", (4, 4))
    assert common_mode("pics", ["a", "b"], [gray, ImageHeader("1", (2, 2))]) == "L"
    assert common_mode("pics", ["a"], [colour]) == "RGB"  # a palette is colour
    with pytest.raises(DataError, match="images of mixed modes"):
        common_mode("pics", ["a", "b"], [gray, colour])
    with pytest.raises(DataError, match="a has mode I;16"):
        common_mode("pics", ["a"], [ImageHeader("I;16", (4, 4))])


def test_a_decoded_image_is_center_cropped_and_resized_as_imageops_fit_does(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (10, 16, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    got = fit_image(decode_file(tmp_path / "a.png", 6), 6, "RGB")
    expected = np.asarray(Image.fromarray(pixels).resize((6, 6), box=(3, 0, 13, 10),
                                                         resample=Image.Resampling.BICUBIC))
    assert got.shape == (3, 6, 6) and got.dtype == np.uint8
    assert np.array_equal(got, expected.transpose(2, 0, 1))  # ImageOps.fit's crop box
    gray = fit_image(Image.fromarray(pixels), 6, "L")
    assert gray.shape == (1, 6, 6)


def test_labels_must_match_the_images_one_each():
    assert np.array_equal(checked_labels(np.array([2, 0, 2]), 3, "d.npz"), [2, 0, 2])
    assert checked_labels(None, 3, "d.npz") is None
    with pytest.raises(DataError, match="d.npz"):
        checked_labels(np.array([0, 1]), 3, "d.npz")


def test_a_message_names_the_first_examples_and_counts_the_rest():
    names = [f"f{i}" for i in range(SHOWN + 2)]
    assert named_examples(names) == ", ".join(names[:SHOWN]) + " and 2 more"
    assert named_examples(names[:1]) == "f0"


def test_empty_class_folders_are_the_folders_holding_none_of_the_images(tmp_path):
    for name in ("ants", "bees", "wasps", ".git"):
        (tmp_path / name).mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "outside")  # a link is named as a link
    names = ["ants/1.png", "ants/2.png", "bees/x/1.png"]
    assert empty_class_folders(tmp_path, names) == ["outside", "wasps"]
    assert empty_class_folders(tmp_path / "missing", names) == []


def test_an_npz_member_that_is_not_an_array_is_named(tmp_path):
    """Issue 41: numpy hands back such a member as bytes; its ``.shape`` was an
    AttributeError."""
    import zipfile

    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("images.npy", np.zeros((2, 4, 4), np.uint8).tobytes())
    with pytest.raises(DataError, match=r"^data x.npz: its member images.npy is not a NumPy "
                                        r"array \(it holds 32 bytes"):
        read_npz(path, "data x.npz")


def test_a_missing_or_empty_path_or_a_folder_without_images_is_refused(tmp_path):
    with pytest.raises(DataError, match="no such file or folder"):
        ImageCorpus.build(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no image files"):
        ImageCorpus.build(tmp_path / "empty")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("words")
    with pytest.raises(DataError, match=r"holds no image files \(1 other file: a.txt"):
        ImageCorpus.build(tmp_path / "text")
    (tmp_path / "zero.npz").write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        ImageCorpus.build(tmp_path / "zero.npz")
    (tmp_path / "one.png").write_bytes(b"x")
    with pytest.raises(DataError, match="not a folder of images or an .npz file"):
        ImageCorpus.build(tmp_path / "one.png")
