"""The dist area's exception: RanksOutOfData (the C++ class, or a stand-in when the area is not
built, so that ``except RanksOutOfData`` works in every build)."""

from .. import _C

_native = getattr(_C, "dist", None)
if _native is not None:
    RanksOutOfData = _native.RanksOutOfData
else:  # built without the area: the name still exists for except clauses

    class RanksOutOfData(RuntimeError):
        pass


RanksOutOfData.__doc__ = (
    "Raised on the ranks still training when another rank left its loop inside join(); "
    "`.ranks` lists the ranks that ran out."
)

__all__ = ["RanksOutOfData"]
