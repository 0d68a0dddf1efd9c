"""Is this host a TPU VM? Its TPU chips show up as device files (/dev/accel* on v4/v5p, /dev/vfio/N on v5e/v6e).
Read before JAX starts (apps/cli.skip_absent_tpu) and before libtpu loads (compile_check): imports nothing heavy."""
import glob


def has_tpu_device_files() -> bool:
  """True where TPU chips are attached to this host (their device files exist)."""
  return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
