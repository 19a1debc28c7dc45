"""A user's images: a folder in the ImageFolder convention or an .npz, decoded by Pillow,
split by the recorded rule; what is refused (one ``DataError`` naming the path and the file).

Provenance: the pixels read are the pixels written (an identity, for images already at the
size asked for, in PNG, BMP, TIFF and an npz's own array); a crop of a wider image is its
central square (an identity); a resize is Pillow's bicubic resize of the same image (the
reference the module names); grayscale, palette and alpha images convert as Pillow's
``convert`` does; the split is the stated CRC-32 rule recomputed with ``zlib``; a batch
replays from a copy of its generator; hypothesis draws damaged image bytes, each of which
must decode or be one ``DataError`` naming its file.
"""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from image_folders import pixels as _pixels
from image_folders import write_folder
from PIL import Image
from properties import examples

from addnorm.data.fingerprint import DataChangedError, DataError, DataReadError
from addnorm.data.images import ImageCorpus


def _channels_first(array: np.ndarray) -> np.ndarray:
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


@pytest.mark.parametrize("suffix", ["png", "bmp", "tif"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_class_folder_reads_back_the_pixels_written(tmp_path, suffix, mode):
    written = write_folder(tmp_path, {"cats": 3, "dogs": 4}, mode=mode, suffix=suffix)
    corpus = ImageCorpus.build(tmp_path)
    assert corpus.classes == ("cats", "dogs") and corpus.mode == mode
    assert corpus.names == tuple(sorted(written))  # by name
    assert corpus.labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    pixels = corpus.pixels(8)
    assert pixels.dtype == torch.uint8 and pixels.shape == (7, 1 if mode == "L" else 3, 8, 8)
    for i, name in enumerate(corpus.names):
        np.testing.assert_array_equal(pixels[i].numpy(), _channels_first(written[name]))


def test_a_flat_folder_is_one_class_named_after_it_and_nested_files_belong_to_their_class(
    tmp_path
):
    flat = tmp_path / "shells"
    flat.mkdir()
    for i in range(3):
        Image.fromarray(_pixels(i, (8, 8, 3))).save(flat / f"{i}.png")
    (flat / "notes.txt").write_text("not an image")
    corpus = ImageCorpus.build(flat)
    assert corpus.classes == ("shells",) and len(corpus) == 3
    assert corpus.record.details["other_files_left_out"] == 1
    nested = tmp_path / "nested"
    write_folder(nested / "a" / "deep", {"x": 2})
    write_folder(nested / "b", {"y": 2})
    assert ImageCorpus.build(nested).classes == ("a", "b")


def test_a_wider_image_is_center_cropped_and_a_larger_one_resized_as_pillow_does(tmp_path):
    wide, big = _pixels(1, (8, 12, 3)), _pixels(2, (16, 16, 3))
    write = tmp_path / "c"
    write.mkdir()
    Image.fromarray(wide).save(write / "a.png")
    Image.fromarray(big).save(write / "b.png")
    corpus = ImageCorpus.build(tmp_path)
    assert corpus.sizes.tolist() == [[12, 8], [16, 16]]  # width, height, from the headers
    pixels = corpus.pixels(8)
    np.testing.assert_array_equal(pixels[0].numpy(), wide[:, 2:10].transpose(2, 0, 1))
    reference = np.asarray(Image.fromarray(big).resize((8, 8), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(pixels[1].numpy(), reference.transpose(2, 0, 1))


@pytest.mark.parametrize(("mode", "kept"), [("P", "RGB"), ("RGBA", "RGB"), ("1", "L"),
                                            ("LA", "L"), ("CMYK", "RGB")])
def test_pillow_modes_convert_as_pillow_converts_them(tmp_path, mode, kept):
    folder = tmp_path / "c"
    folder.mkdir()
    images = [Image.fromarray(_pixels(i, (8, 8, 3))).convert(mode) for i in range(2)]
    for i, image in enumerate(images):
        image.save(folder / f"{i}.{'jpg' if mode == 'CMYK' else 'png'}")
    corpus = ImageCorpus.build(tmp_path)
    assert corpus.mode == kept
    for i, name in enumerate(corpus.names):
        with Image.open(tmp_path / name) as image:
            expected = np.asarray(image.convert(kept))
        np.testing.assert_array_equal(corpus.pixels(8)[i].numpy(), _channels_first(expected))


@pytest.mark.parametrize("layout", ["NHW", "NHWC", "NCHW", "NHW1"])
def test_an_npz_reads_back_its_array_in_every_layout(tmp_path, layout):
    array = _pixels(3, (6, 8, 8, 3)) if layout in ("NHWC", "NCHW") else _pixels(3, (6, 8, 8))
    stored = {"NHW": array, "NHWC": array, "NCHW": array.transpose(0, 3, 1, 2) if
              array.ndim == 4 else array, "NHW1": array[..., None]}[layout]
    np.savez(tmp_path / "d.npz", images=stored, labels=np.array([5, 5, 9, 9, 9, 5]))
    corpus = ImageCorpus.build(tmp_path / "d.npz")
    assert corpus.classes == ("5", "9") and corpus.labels.tolist() == [0, 0, 1, 1, 1, 0]
    expected = array[:, None] if array.ndim == 3 else array.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(corpus.pixels(8).numpy(), expected)
    assert corpus.names[2] == "images[2]" and corpus.record.details["format"] == "npz"
    np.savez(tmp_path / "wide.npz", images=_pixels(4, (2, 6, 10)))  # (N, H, W)
    assert ImageCorpus.build(tmp_path / "wide.npz").sizes.tolist() == [[10, 6], [10, 6]]


def test_npz_floats_and_wide_integers_take_the_0_255_scale_and_string_labels_name_classes(
    tmp_path
):
    array = _pixels(4, (4, 8, 8))
    np.savez(tmp_path / "f.npz", images=array / 255.0, labels=np.array(["b", "a", "b", "a"]))
    np.savez(tmp_path / "i.npz", images=array.astype(np.int64))
    floats, ints = ImageCorpus.build(tmp_path / "f.npz"), ImageCorpus.build(tmp_path / "i.npz")
    assert floats.classes == ("a", "b") and floats.labels.tolist() == [1, 0, 1, 0]
    assert ints.classes == ("i",)  # no labels: one class, named after the file
    for corpus in (floats, ints):
        np.testing.assert_array_equal(corpus.pixels(8)[:, 0].numpy(), array)


def test_the_held_out_split_is_the_stated_crc32_rule_per_class(tmp_path):
    write_folder(tmp_path, {"a": 10, "b": 3, "c": 2})
    corpus = ImageCorpus.build(tmp_path, val_fraction=0.25)
    expected = []
    for c in range(len(corpus.classes)):
        members = [i for i, label in enumerate(corpus.labels) if label == c]
        n_val = min(max(round(0.25 * len(members)), 1), len(members) - 1)
        ranked = sorted(members, key=lambda i: (zlib.crc32(corpus.names[i].encode()),
                                                corpus.names[i]))
        expected += ranked[:n_val]
    assert corpus.val_index.tolist() == sorted(expected)
    assert sorted([*corpus.train_index, *corpus.val_index]) == list(range(15))
    split = corpus.record.split
    assert (split["train_images"], split["val_images"]) == (len(corpus.train_index),
                                                             len(corpus.val_index))


# ---------------------------------------------------------------- what is refused


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_corrupt_image_is_refused_naming_it(tmp_path):
    write_folder(tmp_path, {"a": 3})
    bad = tmp_path / "a" / "img1.png"
    bad.write_bytes(b"this is no PNG at all")
    with pytest.raises(DataError) as error:
        ImageCorpus.build(tmp_path)
    assert _one_line(error).startswith(f"{bad}: cannot be decoded as an image (damaged, "
                                       "truncated, or not a format Pillow reads) (")


def test_a_truncated_image_is_refused_naming_it_when_decoded(tmp_path):
    write_folder(tmp_path, {"a": 3}, size=32, suffix="jpg")
    bad = tmp_path / "a" / "img2.jpg"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) * 3 // 4])  # the header survives, the scan does not
    corpus = ImageCorpus.build(tmp_path)
    with pytest.raises(DataError) as error:
        corpus.pixels(8)
    assert _one_line(error).startswith(f"{bad}: cannot be decoded as an image")
    assert "truncated" in str(error.value)


def test_images_of_mixed_or_unsupported_modes_are_refused_naming_one_of_each(tmp_path):
    write_folder(tmp_path / "mixed", {"a": 2}, mode="RGB")
    write_folder(tmp_path / "mixed", {"b": 2}, mode="L", seed=1)
    with pytest.raises(DataError) as error:
        ImageCorpus.build(tmp_path / "mixed")
    message = _one_line(error)
    assert "images of mixed modes: 2 colour (e.g. a/img0.png (RGB)); 2 grayscale (e.g. " \
           "b/img0.png (L))" in message
    deep = tmp_path / "deep" / "a"
    deep.mkdir(parents=True)
    for i in range(2):
        Image.fromarray(_pixels(i, (8, 8)).astype(np.uint16) * 200).save(deep / f"{i}.png")
    with pytest.raises(DataError, match=r"a/0.png has mode I;16 .*convert it to 8-bit"):
        ImageCorpus.build(tmp_path / "deep")


def test_a_class_of_one_image_and_images_beside_class_folders_are_refused(tmp_path):
    write_folder(tmp_path / "one", {"a": 3, "b": 1})
    with pytest.raises(DataError) as error:
        ImageCorpus.build(tmp_path / "one")
    assert "class 'b' holds one image (b/img0.png); every class needs at least 2" in \
        _one_line(error)
    write_folder(tmp_path / "both", {"a": 2})
    Image.fromarray(_pixels(0, (8, 8, 3))).save(tmp_path / "both" / "top.png")
    with pytest.raises(DataError, match=r"both at its top \(top.png\) and in class folders"):
        ImageCorpus.build(tmp_path / "both")


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"pictures": _pixels(0, (4, 8, 8))}, "holds no 'images' array (it holds pictures)"),
        ({"images": _pixels(0, (4, 8, 8)), "labels": np.arange(3)},
         "labels has shape (3,), but images holds 4 images"),
        ({"images": _pixels(0, (4, 8, 8)), "labels": np.zeros((4, 2))},
         "labels has shape (4, 2)"),
        ({"images": _pixels(0, (4, 8))}, "images has shape (4, 8);"),
        ({"images": _pixels(0, (4, 8, 8, 5))}, "images has shape (4, 8, 8, 5)"),
        ({"images": np.full((4, 8, 8), 1.5)}, "float images must lie in [0, 1], found 1.5..1.5"),
        ({"images": np.full((4, 8, 8), np.nan)}, "images holds 256 non-finite values"),
        ({"images": np.full((4, 8, 8), 300)}, "integer images must lie in 0..255"),
        ({"images": np.zeros((0, 8, 8), np.uint8)}, "no images"),
        ({"images": _pixels(0, (4, 8, 8)), "labels": np.array([0, 0, 0, 1])},
         "class '1' holds one image (images[3])"),
    ],
)
def test_a_bad_npz_is_refused_saying_what_is_wrong(tmp_path, arrays, message):
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(DataError) as error:
        ImageCorpus.build(tmp_path / "d.npz")
    text = _one_line(error)
    assert text.startswith(f"data {tmp_path / 'd.npz'}: ") and message in text, text


def test_an_npz_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"PK\x03\x04 damaged zip")
    with pytest.raises(DataError, match="not an .npz file numpy can read"):
        ImageCorpus.build(tmp_path / "x.npz")
    np.save(tmp_path / "y.npy", _pixels(0, (4, 8, 8)))
    (tmp_path / "y.npy").rename(tmp_path / "y.npz")
    with pytest.raises(DataError, match=r"holds one array \(an .npy file\)"):
        ImageCorpus.build(tmp_path / "y.npz")
    np.savez(tmp_path / "z.npz", images=_pixels(0, (4, 8, 8)),
             labels=np.array([{}, {}, {}, {}], dtype=object))
    with pytest.raises(DataError, match="not an .npz file numpy can read"):
        ImageCorpus.build(tmp_path / "z.npz")


def test_a_file_that_fails_or_changes_while_read_is_a_read_error(tmp_path, monkeypatch):
    write_folder(tmp_path, {"a": 3})
    corpus = ImageCorpus.build(tmp_path)
    changed = tmp_path / "a" / "img0.png"
    Image.fromarray(_pixels(9, (8, 8, 3))).save(changed)
    with pytest.raises(DataReadError, match="changed while it was read"):
        corpus.pixels(8)
    import builtins

    real_open = builtins.open

    def failing_open(file, mode="r", *args, **kwargs):
        if str(file).endswith("img1.png") and "b" in mode:
            raise OSError(5, "Input/output error")
        return real_open(file, mode, *args, **kwargs)

    fresh = ImageCorpus.build(tmp_path)  # the same files again: the cached corpus's pixels
    monkeypatch.setattr(builtins, "open", failing_open)
    with pytest.raises(DataReadError, match=r"img1.png: cannot be read \(Input/output error\)"):
        fresh.pixels(4)


def test_a_run_record_reopens_the_same_images_and_names_what_changed(tmp_path):
    write_folder(tmp_path, {"a": 3, "b": 3})
    corpus = ImageCorpus.build(tmp_path)
    again = ImageCorpus.reopen(corpus.record)
    assert again.names == corpus.names and again.val_index.tolist() == corpus.val_index.tolist()
    (tmp_path / "b" / "img2.png").unlink()
    with pytest.raises(DataChangedError, match="b/img2.png: removed"):
        ImageCorpus.reopen(corpus.record)


@examples(30)
@given(
    fmt=st.sampled_from(["PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF"]),
    cut=st.floats(0.0, 1.0),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_damaged_image_bytes_decode_or_are_refused_naming_the_file(
    tmp_path_factory, fmt, cut, flips, seed
):
    root = tmp_path_factory.mktemp("damaged")
    write_folder(root, {"a": 2})
    buffer = io.BytesIO()
    Image.fromarray(_pixels(seed, (16, 16, 3))).save(buffer, format=fmt)
    data = bytearray(buffer.getvalue()[: max(1, round(cut * len(buffer.getvalue())))])
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    damaged = root / "a" / f"damaged.{fmt.lower()}"
    damaged.write_bytes(bytes(data))
    try:
        corpus = ImageCorpus.build(root)
        pixels = corpus.pixels(8)
    except DataError as err:
        message = str(err)
        assert "\n" not in message
        assert message.startswith(f"{damaged}: ") or message.startswith(f"data {root}: "), \
            message
        return
    assert pixels.shape == (3, 3, 8, 8)  # what Pillow could decode of it, and the others


@pytest.mark.parametrize("size", [8, 6])
def test_rows_decode_only_the_images_asked_for_as_the_pixels_have_them(tmp_path, size):
    """Provenance: ``pixels`` of another corpus of the same files (the decoding rows must
    equal, identity); at 8 the files' own size, at 6 a bicubic resize."""
    write_folder(tmp_path / "d", {"a": 3, "b": 4})
    np.savez(tmp_path / "d.npz", images=_pixels(5, (5, 8, 8, 3)), labels=np.arange(5) % 2)
    for path in (tmp_path / "d", tmp_path / "d.npz"):
        corpus, reference = ImageCorpus.build(path), ImageCorpus.build(path)
        index = torch.tensor([4, 0, 4, 2])
        rows = corpus.rows(index, size)
        assert rows.dtype == torch.uint8 and rows.shape == (4, 3, size, size)
        assert torch.equal(rows, reference.pixels(size)[index])
        assert corpus._pixels == {}  # nothing kept: rows hold what was asked, no more
        corpus.pixels(size)
        assert torch.equal(corpus.rows(np.array([1]), size), reference.pixels(size)[1:2])


def test_check_unchanged_names_a_file_that_changed_after_the_corpus_was_built(tmp_path):
    write_folder(tmp_path, {"a": 3})
    corpus = ImageCorpus.build(tmp_path)
    corpus.rows(torch.arange(3), 8)
    corpus.check_unchanged()  # nothing changed: no error
    Image.fromarray(_pixels(9, (8, 8, 3))).save(tmp_path / "a" / "img0.png")
    with pytest.raises(DataReadError, match=r"changed while it was read \(.*img0.png"):
        corpus.check_unchanged()
