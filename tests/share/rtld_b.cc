// See rtld_a.cc.
extern "C" __attribute__((visibility("default"))) char stoker_probe_layer() {
  return 'B';
}
// Referenced by the probe so that the linker keeps B after A.
extern "C" __attribute__((visibility("default"))) int stoker_probe_b_loaded() {
  return 1;
}
