"""The build side: TOML specs, the compile of one variant (CuTe DSL, imported only to compile), the build
loop over process pools or Dask, CI shards, bundle installs and bundle wheels. Importing this package
imports no DSL."""
