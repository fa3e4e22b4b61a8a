"""Finding nvJPEG for decode="gpu"."""
import os


def find_nvjpeg():
    """Points $STOKER_NVJPEG_LIBRARY at an nvJPEG that pip installed (the
    nvidia-nvjpeg wheels; torchvision's own copy) when the library is not
    on the loader's path and the variable is unset."""
    if os.environ.get("STOKER_NVJPEG_LIBRARY"):
        return
    import ctypes.util
    if ctypes.util.find_library("nvjpeg"):
        return
    import glob
    import importlib.util
    patterns = []
    for package, sub_patterns in (("nvidia", ("nvjpeg/lib/libnvjpeg.so*", "cu13/lib/libnvjpeg.so*")),
                                  ("torchvision", ("../torchvision.libs/libnvjpeg*.so*",))):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            patterns += [os.path.join(location, p) for p in sub_patterns]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            os.environ["STOKER_NVJPEG_LIBRARY"] = os.path.normpath(found[-1])
            return
