"""Which Pillow release stoker's resizes reproduce (include/stoker/pillow.h):
the installed one, chosen when stoker is imported."""
from . import _native


def resize_like_pillow(major=None):
    """stoker's resizes reproduce Pillow's fixed-point arithmetic bit for bit,
    and Pillow 13 changed the order of its two passes: it runs the vertical
    one first when the height shrinks by more than twice as many pixels as
    the width, which changes some pixels by one level. stoker follows the
    installed Pillow (chosen when stoker is imported; Pillow 13 when none
    is installed); ``major`` (a Pillow major version) picks another release
    for the whole process. Returns the order followed: 13 (Pillow >= 13) or
    12 (Pillow <= 12)."""
    if major is not None:
        _native.set_pillow_resize_order(int(major))
    return _native.pillow_resize_order()


def _installed_pillow_major():
    try:
        import PIL
        return int(str(PIL.__version__).split(".")[0])
    except (ImportError, AttributeError, ValueError):
        return None


_pillow = _installed_pillow_major()
if _pillow is not None:
    resize_like_pillow(_pillow)
