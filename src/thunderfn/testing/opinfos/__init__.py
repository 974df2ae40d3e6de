"""The OpInfo database: one module per torch-language module, each exporting `opinfos`."""
from thunderfn.testing.opinfos import (
    aten_backward,
    conv_pool,
    elementwise,
    factories,
    indexing,
    inplace,
    linalg,
    nn,
    reductions,
    shape,
    statistics,
)

op_db = [*elementwise.opinfos, *reductions.opinfos, *shape.opinfos, *indexing.opinfos, *factories.opinfos, *nn.opinfos,
          *inplace.opinfos, *statistics.opinfos, *linalg.opinfos, *aten_backward.opinfos,
          *conv_pool.opinfos]
