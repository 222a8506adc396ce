// sample stand-in for support's definition (code is not read by machine_nb)
export default { name: "support" };
