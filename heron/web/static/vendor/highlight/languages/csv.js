var e=[{expand:"strDouble"},{type:"oper",match:/,/g}];export{e as default};
